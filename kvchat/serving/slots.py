"""Many conversations on one llama.cpp context: one sequence each, decoded together.

The context has `n_slots` sequences without a unified cache, so each sequence has its own stream
of `slot_cells` cells. A conversation's prompt is read and pruned on a context of its own (the
reading needs the whole document at once); its kept cells are then moved into a free sequence
here, and every decode step feeds one token of every answering sequence to one llama_decode.

A sequence holds cells only while it answers. A follow-up is not continued in its conversation's
sequence: those cells were kept for the previous question (a selection serves one question),
so every request is read or loaded anew and selects again (requests.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvchat.engine import KvLayout
from kvchat.llama import LlamaContext, LlamaModel, StateBytes, state_for_streams

DEFAULT_ROOM = 1024  # cells a sequence holds for the question and earlier turns, besides the budget


@dataclass
class Slot:
    """One sequence of the shared context."""

    seq: int
    next_pos: int = 0  # where the next token goes
    cells: int = 0
    busy: bool = False  # an answer is being generated in it (otherwise it holds no cells)


class SlotDecoder:
    def __init__(
        self, model: LlamaModel, n_slots: int, slot_cells: int, threads: int | None = None, layout: KvLayout = KvLayout()
    ) -> None:
        self.model = model
        self.slot_cells = slot_cells
        self.layout = layout  # the states loaded into the slots must have been read with it
        self.ctx = LlamaContext(model, layout.context(n_slots * slot_cells, max(512, n_slots), threads, n_seq_max=n_slots))
        self.slots = [Slot(seq) for seq in range(n_slots)]

    def free_slot(self) -> Slot | None:
        """A slot that is not answering, or None: every slot is."""
        return next((slot for slot in self.slots if not slot.busy), None)

    def load(self, slot: Slot, state: StateBytes, positions: np.ndarray) -> None:
        """Put a pruned prompt's cells (a one-sequence state) into the free `slot`; the answer's
        tokens follow its last position."""
        self.ctx.load_state(state_for_streams(state, len(self.slots)), slot.seq)
        slot.busy = True
        slot.cells, slot.next_pos = len(positions), int(positions[-1]) + 1

    def room(self, slot: Slot) -> int:
        """Cells left in the slot's stream."""
        return self.slot_cells - slot.cells

    def step(self, slots: list[Slot], tokens: list[int]) -> None:
        """Decode token i into slots[i] (one llama_decode for all); logits row i belongs to slot i."""
        self.ctx.decode_many(tokens, [slot.next_pos for slot in slots], [slot.seq for slot in slots])
        for slot in slots:
            slot.next_pos += 1
            slot.cells += 1

    def release(self, slot: Slot) -> None:
        """Drop the slot's cells: it is free again."""
        self.ctx.remove(slot.seq, -1, -1)
        slot.busy, slot.cells, slot.next_pos = False, 0, 0

    def close(self) -> None:
        self.ctx.close()
