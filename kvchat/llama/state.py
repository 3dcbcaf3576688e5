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
