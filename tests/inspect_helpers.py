"""What the tests read that the library itself never needs: the last logits, a sequence's position
range, a plan's dropped runs, each query row's attention mass, layer 0's attention output and
the V a state holds.

Built on the context's raw handle (`LlamaContext.handle`), a plan's `kept` positions and the
attention probe's own node reading, so the library carries no code that only tests call.
"""

from __future__ import annotations

import struct

import numpy as np

from kvchat.llama import AttentionProbe, LlamaContext
from kvchat.llama._lib import GgmlTensorHead, raw
from kvchat.llama.state import cell_table
from kvchat.policy import PrunePlan, merge_runs


def returned(events):
    """Run a generator of events to its end; the value it returns (a Selected, a PreparedPrompt …)."""
    while True:
        try:
            next(events)
        except StopIteration as finished:
            return finished.value


def last_logits(ctx: LlamaContext) -> np.ndarray:
    """Next-token logits of the last row the last decode kept logits for (a copy)."""
    pointer = raw.llama_get_logits_ith(ctx.handle, -1)
    if not pointer:
        raise RuntimeError("the last decode produced no logits")
    return np.ctypeslib.as_array(pointer, shape=(ctx.model.shape.n_vocab,)).copy()


def seq_pos_range(ctx: LlamaContext, seq: int = 0) -> tuple[int, int]:
    """The smallest and the largest position llama.cpp's memory holds for `seq`."""
    memory = raw.llama_get_memory(ctx.handle)
    return raw.llama_memory_seq_pos_min(memory, seq), raw.llama_memory_seq_pos_max(memory, seq)


def drop_runs(plan: PrunePlan) -> list[tuple[int, int]]:
    """The positions the plan does not keep, merged into half-open runs [p0, p1)."""
    dropped = np.ones(plan.n_tokens, dtype=bool)
    dropped[plan.kept] = False
    return merge_runs(np.flatnonzero(dropped))


class RowMassProbe(AttentionProbe):
    """An attention probe that also sums each query row of `kq_soft_max-<layer>` over the valid
    cells. Install it before the context is made, e.g.
    `monkeypatch.setattr("kvchat.llama.context.AttentionProbe", RowMassProbe)`."""

    def start(self, n_cells: int) -> None:
        super().start(n_cells)
        self._mass: dict[int, list[np.ndarray]] = {}

    def _collect(self, tensor: int, layer: int) -> None:
        super()._collect(tensor, layer)
        head = GgmlTensorHead.from_address(tensor)
        n_kv, n_tokens, n_head, n_stream = (int(n) for n in head.ne)
        rows = self._probabilities(tensor, head).reshape(n_stream, n_head, n_tokens, n_kv)[0, :, :, : self._n_cells]
        self._mass.setdefault(layer, []).append(rows.sum(axis=-1))

    def row_mass(self) -> np.ndarray:
        """Per layer, head and query row of the last observation: the attention mass on valid
        cells (should be ~1)."""
        return np.stack([np.concatenate(self._mass[il], axis=1) for il in range(self.n_layer)])


class OutputProbe(AttentionProbe):
    """An attention probe that also keeps layer 0's attention output (`kqv_out-0`, the heads'
    weighted values side by side, before the output projection) of the tokens it observes."""

    def start(self, n_cells: int) -> None:
        super().start(n_cells)
        self.output: np.ndarray | None = None

    def _on_node(self, tensor: int, ask: bool, user_data: object) -> bool:
        if self._active and self._lib.ggml_get_name(tensor) == b"kqv_out-0":
            if not ask:
                head = GgmlTensorHead.from_address(tensor)
                width, n_tokens = int(head.ne[0]), int(head.ne[1])
                self.output = self._probabilities(tensor, head)[: width * n_tokens].reshape(n_tokens, width).copy()
            return True
        return super()._on_node(tensor, ask, user_data)


def cell_values(state: bytes, n_layer: int) -> np.ndarray:
    """The V of every cell of a one-sequence f16 state written with V transposed (flash attention
    off), (n_layer, cells, n_embd_v) float32."""
    positions, offset = cell_table(state)
    n_cells = len(positions)
    v_trans, layers = struct.unpack_from("<II", state, offset)
    assert v_trans == 1 and layers == n_layer
    offset += 8
    for _ in range(n_layer):  # skip K
        _type, row_bytes = struct.unpack_from("<iQ", state, offset)
        offset += 12 + n_cells * row_bytes
    values = []
    for _ in range(n_layer):
        _type, element_bytes, n_embd = struct.unpack_from("<iII", state, offset)
        assert element_bytes == 2
        offset += 12
        columns = np.frombuffer(state, dtype=np.float16, count=n_embd * n_cells, offset=offset)
        values.append(columns.reshape(n_embd, n_cells).T.astype(np.float32))
        offset += n_embd * n_cells * element_bytes
    return np.stack(values)
