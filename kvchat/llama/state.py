"""Read the cell table at the head of a sequence state (llama_state_seq_get_data's format).

Layout (llama.cpp 0.3.36, ordinary KV cache): u32 magic 0xaf143cd8, i32 seq_id, u32 n_stream,
then per stream u32 cell_count followed by cell_count x (i32 pos, u32 n_seq_id, n_seq_id x i32
seq_id), then the K/V data.
"""

from __future__ import annotations

import struct

import numpy as np

STATE_MAGIC = 0xAF143CD8
HEADER = struct.Struct("<IiII")


def cell_positions(state: bytes) -> np.ndarray:
    """Positions of the cells in the first stream of a one-sequence state, in cell order."""
    if len(state) < HEADER.size:
        return np.zeros(0, dtype=np.int64)
    magic, _seq, n_stream, cell_count = HEADER.unpack_from(state, 0)
    if magic != STATE_MAGIC or n_stream < 1:
        raise ValueError("not a llama.cpp sequence state")
    offset = HEADER.size
    positions = np.empty(cell_count, dtype=np.int64)
    for index in range(cell_count):
        pos, n_seq = struct.unpack_from("<iI", state, offset)
        positions[index] = pos
        offset += 8 + 4 * n_seq
    return positions


def for_streams(state: bytes | bytearray | memoryview, n_stream: int) -> bytes | bytearray | memoryview:
    """A one-stream sequence state rewritten for a context whose cache has `n_stream` streams
    (several sequences without a unified cache): the same cells in the first stream, the other
    streams empty. llama.cpp restores every non-empty stream of a sequence state into the
    destination sequence's own stream, but refuses a state whose stream count differs."""
    magic, seq, streams, _count = HEADER.unpack_from(state, 0)
    if magic != STATE_MAGIC or streams != 1:
        raise ValueError("not a one-stream llama.cpp sequence state")
    if n_stream == 1:
        return state
    converted = bytearray(state)
    struct.pack_into("<I", converted, 8, n_stream)
    converted += b"\0" * 4 * (n_stream - 1)
    return converted


def cell_keys(state: bytes | bytearray | memoryview, n_layer: int) -> np.ndarray:
    """The K rows of a one-sequence state, (n_layer, n_cells, n_embd_k) float32 (f16/f32 caches).

    After the cell table: u32 v_trans, u32 n_layer, then per layer i32 type, u64 row size and
    one row per cell, in cell order."""
    magic, _seq, n_stream, cell_count = HEADER.unpack_from(state, 0)
    if magic != STATE_MAGIC or n_stream < 1:
        raise ValueError("not a llama.cpp sequence state")
    offset = HEADER.size
    for _ in range(cell_count):
        _pos, n_seq = struct.unpack_from("<iI", state, offset)
        offset += 8 + 4 * n_seq
    _v_trans, layers = struct.unpack_from("<II", state, offset)
    offset += 8
    if layers != n_layer:
        raise ValueError(f"state has {layers} layers, the model {n_layer}")
    keys = []
    for _ in range(n_layer):
        type_id, row_bytes = struct.unpack_from("<iQ", state, offset)
        offset += 12
        dtype = {0: np.float32, 1: np.float16}.get(type_id)
        if dtype is None:
            raise ValueError(f"K cache type {type_id} is not f16 or f32")
        rows = np.frombuffer(state, dtype=dtype, count=cell_count * row_bytes // np.dtype(dtype).itemsize, offset=offset)
        keys.append(rows.reshape(cell_count, -1).astype(np.float32))
        offset += cell_count * row_bytes
    return np.stack(keys)
