"""Per-head kept sets in shared cells: a sequence state rewritten so that each layer and KV head
holds its own tokens (SnapKV's per-head selection, kept in llama.cpp's cells as KVCompose keeps
per-head choices in shared "composite" slots).

llama.cpp stores K already rotated by RoPE at its token's position, so a query scores a key by
their true distance whatever cell the key sits in: a cell's position only serves the causal mask
and later shifts (which rotate every head of the cell alike). So cell i may hold, in layer l and
KV head h, the K and V of any token that head chose, and B cells hold B tokens per head.

The state's layout after the cell table (state.py): u32 v_trans, u32 n_layer; per layer i32 ggml
type, u64 row bytes and one K row per cell (the KV heads side by side); then V, per layer: rows
like K, or, transposed (v_trans, flash attention off), i32 type, u32 element bytes, u32 n_embd_v
and for each of the n_embd_v dimensions one element per cell (head h owns the dimensions
h·head_dim_v onwards).
"""

from __future__ import annotations

import struct

import numpy as np

from kvchat.llama.state import HEADER, STATE_MAGIC, cell_table

_CELL = np.dtype([("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])


def composite_state(state: bytes, sources: np.ndarray, positions: np.ndarray) -> bytes:
    """A one-sequence state of B cells from `state`: cell i holds, in layer l and KV head h, what
    the state's cell `sources[l, h, i]` held there. `sources` is (n_layer, n_head_kv, B) cell
    indices, `positions` the B new cells' positions (increasing). Raises ValueError for a state
    laid out otherwise (several streams, an M-RoPE cell table, a recurrent part); a quantized type
    whose blocks would straddle two heads never gets here (context.py refuses it)."""
    magic, seq, n_stream, _ = HEADER.unpack_from(state, 0)
    if magic != STATE_MAGIC or n_stream != 1:
        raise ValueError("not a one-stream llama.cpp sequence state")
    old_positions, offset = cell_table(state)
    n_cells, (n_layer, _, width) = len(old_positions), sources.shape
    if width != len(positions) or (width and (sources.min() < 0 or sources.max() >= n_cells)):
        raise ValueError("the sources do not index the state's cells")
    v_trans, layers = struct.unpack_from("<II", state, offset)
    if layers != n_layer:
        raise ValueError(f"the state has {layers} layers, the sources {n_layer}")
    cells = np.empty(width, dtype=_CELL)
    cells["pos"], cells["n_seq"], cells["seq"] = positions, 1, seq
    data = np.frombuffer(state, dtype=np.uint8)
    out = [HEADER.pack(magic, seq, 1, width), cells.tobytes(), state[offset : offset + 8]]
    offset += 8
    for layer in range(n_layer):  # K
        offset = _rows(data, offset, n_cells, sources[layer], out)
    for layer in range(n_layer):  # V
        if v_trans:
            offset = _columns(data, offset, n_cells, sources[layer], out)
        else:
            offset = _rows(data, offset, n_cells, sources[layer], out)
    if offset != len(state):
        raise ValueError("the state holds more than one KV cache")
    return b"".join(out)


def _rows(data: np.ndarray, offset: int, n_cells: int, sources: np.ndarray, out: list[bytes]) -> int:
    """One layer stored as a row per cell: row i of the result takes head h's bytes of row sources[h, i]."""
    _, row_bytes = struct.unpack_from("<iQ", data, offset)
    n_head_kv = len(sources)
    rows = data[offset + 12 : offset + 12 + n_cells * row_bytes].reshape(n_cells, n_head_kv, -1)
    out += [data[offset : offset + 12].tobytes(), rows[sources.T, np.arange(n_head_kv)].tobytes()]
    return offset + 12 + n_cells * row_bytes


def _columns(data: np.ndarray, offset: int, n_cells: int, sources: np.ndarray, out: list[bytes]) -> int:
    """One transposed V layer: for each dimension one element per cell; head h's dimensions take
    their elements from the cells sources[h]."""
    _, element_bytes, n_embd = struct.unpack_from("<iII", data, offset)
    n_head_kv = len(sources)
    size = n_embd * n_cells * element_bytes
    columns = data[offset + 12 : offset + 12 + size].reshape(n_head_kv, n_embd // n_head_kv, n_cells, element_bytes)
    gathered = columns[np.arange(n_head_kv)[:, None], :, sources]  # (n_head_kv, B, head_dim, element)
    out += [data[offset : offset + 12].tobytes(), gathered.transpose(0, 2, 1, 3).tobytes()]
    return offset + 12 + size
