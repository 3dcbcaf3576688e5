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
