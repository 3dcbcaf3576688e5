"""Several saved runs of cells as one sequence state: a passage bank's chosen passages, each saved
alone (state_from), loaded into a context at once (llama_state_seq_set_data empties the sequence
it restores, so pieces cannot be loaded one after another).

Each piece is a one-stream, one-sequence state of the same KV layout (state.py, composite.py).
The joined state holds their cells in the order given, with their positions: the caller gives
pieces whose positions increase across them. K keeps the rotation of each cell's own position;
a shift (llama_memory_seq_add) after loading moves the cells to the positions they are read at.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from kvchat.llama.state import HEADER, STATE_MAGIC, cell_table

_LAYOUT = struct.Struct("<II")  # v_trans, n_layer
_ROWS = struct.Struct("<iQ")  # a layer stored a row per cell: ggml type, row bytes
_COLUMNS = struct.Struct("<iII")  # a transposed V layer: ggml type, element bytes, n_embd_v

StateBuffer = bytes | bytearray | memoryview


def joined_state(pieces: Sequence[StateBuffer]) -> bytes:
    """One sequence state holding every piece's cells, in order. ValueError for pieces laid out
    otherwise than each other or than one stream of one sequence."""
    if not pieces:
        raise ValueError("nothing to join")
    parsed = [StateParts(piece) for piece in pieces]
    first = parsed[0]
    if any(piece.layout != first.layout for piece in parsed):
        raise ValueError("the pieces have different KV layouts")
    n_cells = sum(piece.n_cells for piece in parsed)
    out = [HEADER.pack(STATE_MAGIC, first.seq, 1, n_cells), *(piece.cell_bytes for piece in parsed),
           _LAYOUT.pack(first.v_trans, first.n_layer)]
    for layer in range(2 * first.n_layer):  # K's layers, then V's
        out.append(first.layer_headers[layer])
        if first.v_trans and layer >= first.n_layer:  # per dimension, one element per cell: the pieces side by side
            out.append(np.concatenate([piece.layers[layer] for piece in parsed], axis=1).tobytes())
        else:
            out.extend(piece.layers[layer].tobytes() for piece in parsed)
    return b"".join(out)


def state_from(state: StateBuffer, first_cell: int, end_cell: int | None = None) -> bytes:
    """The state of the cells [first_cell, end_cell) (to the last when None): a passage read after
    the prompt's opening, or the part of it before a question's window."""
    piece = StateParts(state)
    end = piece.n_cells if end_cell is None else min(end_cell, piece.n_cells)
    offsets = piece.cell_offsets
    out = [HEADER.pack(STATE_MAGIC, piece.seq, 1, end - first_cell), piece.cell_bytes[offsets[first_cell] : offsets[end]],
           _LAYOUT.pack(piece.v_trans, piece.n_layer)]
    for layer, (header, data) in enumerate(zip(piece.layer_headers, piece.layers)):
        out.append(header)
        if piece.v_trans and layer >= piece.n_layer:
            element_bytes = data.shape[1] // max(piece.n_cells, 1)
            out.append(data[:, first_cell * element_bytes : end * element_bytes].tobytes())
        else:
            out.append(data[first_cell:end].tobytes())
    return b"".join(out)


class StateParts:
    """One state's cell table and its layers' data, as views of its bytes."""

    def __init__(self, state: StateBuffer) -> None:
        self.layers_start, self.n_cells, self.n_layer, self.v_trans = self.prefix(state)
        self.seq = HEADER.unpack_from(state, 0)[1]
        self.cell_bytes = bytes(state[HEADER.size : self.layers_start - _LAYOUT.size])
        self.cell_offsets = _cell_offsets(self.cell_bytes, self.n_cells)
        data = np.frombuffer(state, dtype=np.uint8)
        self.layer_headers: list[bytes] = []
        self.layers: list[np.ndarray] = []  # rows (n_cells, row bytes), or a transposed V's (n_embd_v, n_cells x element bytes)
        offset = self.layers_start
        for layer in range(2 * self.n_layer):
            transposed = bool(self.v_trans) and layer >= self.n_layer
            header, size = self.layer_size(state, offset, self.n_cells, transposed)
            self.layer_headers.append(data[offset : offset + header].tobytes())
            rows = _COLUMNS.unpack_from(state, offset)[2] if transposed else self.n_cells
            self.layers.append(data[offset + header : offset + header + size].reshape(rows, -1) if size else
                               np.zeros((rows, 0), dtype=np.uint8))
            offset += header + size
        if offset != len(data):
            raise ValueError("the state holds more than one KV cache")

    @staticmethod
    def prefix(state: StateBuffer) -> tuple[int, int, int, int]:
        """Where a one-stream, one-sequence state's first layer begins, its cells, layers and v_trans."""
        magic, _seq, n_stream, _ = HEADER.unpack_from(state, 0)
        if magic != STATE_MAGIC or n_stream != 1:
            raise ValueError("not a one-stream llama.cpp sequence state")
        positions, offset = cell_table(state)
        v_trans, n_layer = _LAYOUT.unpack_from(state, offset)
        return offset + _LAYOUT.size, len(positions), n_layer, v_trans

    @staticmethod
    def layer_size(state: StateBuffer, offset: int, n_cells: int, transposed: bool) -> tuple[int, int]:
        """The header's and the data's bytes of the layer at `offset`."""
        if transposed:
            _, element_bytes, n_embd = _COLUMNS.unpack_from(state, offset)
            return _COLUMNS.size, n_embd * n_cells * element_bytes
        _, row_bytes = _ROWS.unpack_from(state, offset)
        return _ROWS.size, n_cells * row_bytes

    @property
    def layout(self) -> tuple[object, ...]:
        """What must agree between pieces: every layer's header (type and sizes per cell)."""
        return self.v_trans, self.n_layer, tuple(self.layer_headers)


def _cell_offsets(table: bytes, n_cells: int) -> list[int]:
    """Where each cell's entry begins in a cell table (i32 pos, u32 n_seq_id, n_seq_id x i32), and its end."""
    offsets, offset = [], 0
    for _ in range(n_cells):
        offsets.append(offset)
        offset += 8 + 4 * struct.unpack_from("<I", table, offset + 4)[0]
    return offsets + [offset]
