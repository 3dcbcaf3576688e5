"""The KV cache of one sequence as kvchat sees it: which position and token each cell holds.

Cells stay dense (hole-free) and in position order: every decode appends, every prune removes
runs and compacts. So cell index i holds `positions[i]`, and the attention probe's columns are
cells. The same bookkeeping serves one-shot SnapKV (positions 0..n-1), streaming reading
(sparse positions) and the decode ring. `origins[i]` is the index in the prompt of the token
cell i holds: its position, until a repack renumbers positions (streamed reading, the ring).
KvCache is the only writer of that record: what the readings do to the cells (decode, observe,
prune, repack, load) are its methods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import numpy as np

from kvchat.errors import SettingsError, raise_if_cancelled
from kvchat.engine.kvcache.foreground import batch_stop
from kvchat.engine.kvcache.keeping import KeptCells
from kvchat.events import Progress
from kvchat.llama import ContextSettings, LlamaContext, StateBytes
from kvchat.policy import Method


@dataclass(frozen=True)
class SavedCells:
    """A sequence's cells as llama.cpp's state, with kvchat's record of what they hold."""

    state: StateBytes
    positions: np.ndarray
    tokens: np.ndarray
    origins: np.ndarray
    head_origins: np.ndarray | None = None


class KvCache(KeptCells):
    """A context's cells and kvchat's record of what they hold; the only writer of that record
    (which of them a prune keeps, and keeping them: KeptCells, keeping.py)."""

    def __init__(self, ctx: LlamaContext) -> None:
        self.ctx = ctx
        self.positions = np.zeros(0, dtype=np.int64)
        self.tokens = np.zeros(0, dtype=np.int64)
        self.origins = np.zeros(0, dtype=np.int64)
        self.head_origins: np.ndarray | None = None  # per layer and KV head, once kept per head
        self.next_pos = 0
        self.next_origin = 0  # the prompt index of the next token decoded
        self.peak_cells = 0

    @property
    def cells(self) -> int:
        return len(self.positions)

    def reset(
        self,
        positions: np.ndarray | None = None,
        tokens: np.ndarray | None = None,
        origins: np.ndarray | None = None,
        head_origins: np.ndarray | None = None,
    ) -> None:
        """Forget the bookkeeping (after clearing or loading the context's memory); `origins`
        default to the positions (a cache never repacked), `head_origins` to every head holding
        the cell's own token; the next token decoded is the prompt's one after the last origin."""
        self.positions = np.zeros(0, dtype=np.int64) if positions is None else positions.astype(np.int64)
        self.tokens = np.zeros(0, dtype=np.int64) if tokens is None else tokens.astype(np.int64)
        self.origins = self.positions.copy() if origins is None else origins.astype(np.int64)
        self.head_origins = head_origins
        self.next_pos = int(self.positions[-1]) + 1 if len(self.positions) else 0
        self.next_origin = int(self.origins[-1]) + 1 if len(self.origins) else 0
        self.peak_cells = max(self.peak_cells, self.cells)

    def clear(self) -> None:
        """Empty llama.cpp's memory of the sequence and the bookkeeping."""
        self.ctx.clear()
        self.reset()

    def decode(self, tokens: list[int], want_logits: bool = False) -> None:
        """Decode `tokens` at the next positions (in n_batch slices) and record their cells."""
        step = self.ctx.settings.n_batch
        for offset in range(0, len(tokens), step):
            batch = tokens[offset : offset + step]
            last = offset + step >= len(tokens)
            self.ctx.decode(batch, self.next_pos, want_logits=want_logits and last)
            self._append(batch)

    def prefill(
        self, tokens: list[int], done: int, total: int, cancel: threading.Event | None = None
    ) -> Generator[Progress, None, None]:
        """decode() with progress: `done` of `total` prompt tokens were read before these. A batch
        stops part-way once `cancel` is set (CancelledError; the cache holds the batches before
        it), or while the check of the thread that reads it holds (foreground.batch_stop: a
        background reading, for a question): its progress is told again, unchanged, and the batch
        read anew once that event is taken. Each Progress's time is that of the batches read (not
        one stopped part-way, nor the time its consumer held an event)."""
        step, reading_s = self.ctx.settings.n_batch, 0.0
        for offset in range(0, len(tokens), step):
            raise_if_cancelled(cancel)
            batch = tokens[offset : offset + step]
            while True:
                started = time.perf_counter()
                if self._read_unless_stopped(batch, cancel):
                    reading_s += time.perf_counter() - started
                    break
                raise_if_cancelled(cancel)
                yield Progress(done=done + offset, total=total, elapsed_s=reading_s, read_from=done)
            self._append(batch)
            yield Progress(done=done + offset + len(batch), total=total, elapsed_s=reading_s, read_from=done)

    def _read_unless_stopped(self, batch: list[int], cancel: threading.Event | None) -> bool:
        """Read `batch` at the next positions, unless stopped part-way (prefill()); whether it was read."""
        stop = batch_stop(cancel)  # looked up per batch: a reading begun in the background may be taken over
        if stop is None:  # nothing can stop it: no Python call between its nodes
            self.ctx.decode(batch, self.next_pos, want_logits=False)
            return True
        return self.ctx.decode_unless(batch, self.next_pos, stop)

    def prefill_chosen(
        self, prompt: list[int], chosen: np.ndarray, next_origin: int, cancel: threading.Event | None = None
    ) -> Iterator[Progress]:
        """Read the prompt's `chosen` tokens (their indices in it, increasing) after the cells held
        (none: a fast reading's re-reading; a bank's passages: passage_bank.py) at consecutive
        positions, with their own progress; the new cells' origins are `chosen`, and the next
        token decoded is the prompt's `next_origin`."""
        held = self.origins
        yield from self.prefill([prompt[index] for index in chosen], 0, len(chosen), cancel)
        self.origins = np.concatenate([held, np.asarray(chosen, dtype=np.int64)])
        self.next_origin = next_origin

    def skip_to(self, position: int) -> None:
        """Read the next token at `position`, and as the prompt's token there, right after the
        cells held, which move to end there (llama.cpp reads a batch only right after the last
        position): a passage read alone after the prompt's opening, at its own place in the
        document (passage_bank.py)."""
        if self.cells and position != self.next_pos:
            self.move_to(self.positions + (position - self.next_pos))
        self.next_pos = self.next_origin = position

    def drop_from(self, cell: int) -> None:
        """Remove the cells from `cell` on (the last ones: no hole is left); the next token is read
        after the cells kept."""
        if cell < self.cells:
            self.ctx.remove(0, int(self.positions[cell]), -1)
        self.reset(self.positions[:cell], self.tokens[:cell], self.origins[:cell])

    def _append(self, tokens: list[int]) -> None:
        new_positions = np.arange(self.next_pos, self.next_pos + len(tokens), dtype=np.int64)
        new_origins = np.arange(self.next_origin, self.next_origin + len(tokens), dtype=np.int64)
        self.origins = np.concatenate([self.origins, new_origins])
        if self.head_origins is not None:
            shape = (*self.head_origins.shape[:2], len(tokens))
            self.head_origins = np.concatenate([self.head_origins, np.broadcast_to(new_origins, shape)], axis=-1)
        self.next_origin += len(tokens)
        self.positions = np.concatenate([self.positions, new_positions])
        self.tokens = np.concatenate([self.tokens, np.asarray(tokens, dtype=np.int64)])
        self.next_pos += len(tokens)
        self.peak_cells = max(self.peak_cells, self.cells)

    def observe(self, window: list[int], keep: bool = True) -> np.ndarray:
        """Decode `window` with the attention probe on; votes (n_layer, n_head, cells).

        With keep=False the window is a temporary observer (the question while reading) and is
        removed again; the votes then cover only the cells that were there before it.
        """
        probe = self.ctx.probe
        before = self.cells
        probe.start(before + len(window))
        try:
            self.ctx.decode(window, self.next_pos)
        except BaseException:
            probe.abort()
            raise
        votes = probe.stop()
        if keep:
            self._append(window)
            return votes
        self.ctx.remove(0, self.next_pos, -1)
        self.peak_cells = max(self.peak_cells, before + len(window))
        return votes[..., :before]

    def keep_chosen_by(
        self, window: list[int], method: Method, pinned: tuple[int, int] | None = None, first: np.ndarray | None = None,
    ) -> float:
        """Decode the question's `window` with the attention probe on, and keep the cells `method`
        chooses by its votes (`pinned` as in plan(); the cells of the prompt tokens `first` within
        the budget before the votes choose). Returns the seconds the compaction took."""
        votes = self.observe(window)
        firsts = None if first is None else np.isin(self.origins, first)
        plan = self.plan(method, len(window), votes, pinned, firsts)
        started = time.perf_counter()
        self.apply(plan)
        return time.perf_counter() - started

    def reobserve(self, first_cell: int, count: int) -> np.ndarray:
        """Decode the cells from `first_cell` on once more, the first `count` of them with the
        attention probe on; their votes (n_layer, n_head, first_cell) over the cells before them.
        The newest cells go and come back with the same tokens at the same positions, so no
        hole is left and the cache ends as it was. They must hold consecutive positions."""
        tokens = [int(t) for t in self.tokens[first_cell:]]
        start = int(self.positions[first_cell])
        self.ctx.remove(0, start, -1)
        self.positions, self.tokens = self.positions[:first_cell], self.tokens[:first_cell]
        self.next_origin = int(self.origins[first_cell])
        self.origins = self.origins[:first_cell]
        if self.head_origins is not None:
            self.head_origins = self.head_origins[..., :first_cell]
        self.next_pos = start
        votes = self.observe(tokens[:count])
        self.decode(tokens[count:])
        return votes[..., :first_cell]

    def repack(self) -> None:
        """Shift positions so they are dense from 0 (seq_add per run; K is re-rotated by llama.cpp)."""
        if self.cells == 0:
            self.next_pos = 0
            return
        self.move_to(np.arange(self.cells, dtype=np.int64))

    def move_to(self, targets: np.ndarray) -> None:
        """Give the cells the positions `targets` (increasing, as theirs are), one seq_add per run
        of cells that move alike, in the order that never lands a run on one still to move (K is
        re-rotated by llama.cpp at the next decode)."""
        if not self.ctx.can_shift():
            raise SettingsError(
                "this model's cache cannot shift positions, so it cannot read past its trained context",
                "use a shorter document or `method` snapkv",
            )
        targets = np.asarray(targets, dtype=np.int64)
        deltas = targets - self.positions
        bounds = [0, *(np.flatnonzero(np.diff(deltas)) + 1).tolist(), self.cells]
        runs = list(zip(bounds, bounds[1:]))
        for start, end in reversed(runs) if (deltas > 0).any() else runs:  # up: the last run first
            if delta := int(deltas[start]):
                self.ctx.shift(0, int(self.positions[start]), int(self.positions[end - 1]) + 1, delta)
        self.positions = targets
        self.next_pos = int(targets[-1]) + 1

    def keep_prefix(self, n_positions: int) -> None:
        """Keep the cells of positions [0, n_positions) (all there), continue at n_positions."""
        self.keep_cells(np.flatnonzero(self.positions < n_positions))
        self.next_pos = self.next_origin = n_positions

    def recreate(self, settings: ContextSettings) -> None:
        """Replace the context by one with `settings` (more cells), keeping the cells; the old
        one is closed first, so the two are never held at once."""
        saved, model = self.saved(), self.ctx.model
        self.ctx.close()
        self.ctx = LlamaContext(model, settings)
        self.restore(saved)

    def state(self) -> bytes:
        return self.ctx.state_bytes(0)

    def saved(self) -> SavedCells:
        """The cells as they are now, to restore() later (here or on another context)."""
        return SavedCells(self.state(), self.positions, self.tokens, self.origins, self.head_origins)

    def restore(self, saved: SavedCells) -> None:
        self.load(saved.state, saved.positions, saved.tokens, saved.origins)
        self.head_origins = saved.head_origins

    def load(self, state: StateBytes, positions: np.ndarray, tokens: np.ndarray, origins: np.ndarray | None = None) -> None:
        """Load a state whose cells hold `tokens` at `positions` (the same token in every head)."""
        self.ctx.clear()
        self.ctx.load_state(state, 0)
        self.reset(positions, tokens, origins)
