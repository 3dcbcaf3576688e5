"""Read the cell table at the head of a sequence state (llama_state_seq_get_data's format).

Layout (llama.cpp 0.3.36, ordinary KV cache): u32 magic 0xaf143cd8, i32 seq_id, u32 n_stream,
then per stream u32 cell_count followed by cell_count x (i32 pos, u32 n_seq_id, n_seq_id x i32
seq_id), then the K/V data.
"""

from __future__ import annotations

import os
import struct

import numpy as np

STATE_MAGIC = 0xAF143CD8
HEADER = struct.Struct("<IiII")
LAYOUT = struct.Struct("<II")  # after the cell table: v_trans, n_layer
_ROWS = struct.Struct("<iQ")  # a layer stored a row per cell: ggml type, row bytes
_COLUMNS = struct.Struct("<iII")  # a transposed V layer: ggml type, element bytes, n_embd_v

StateBuffer = bytes | bytearray | memoryview


def cell_positions(state: bytes) -> np.ndarray:
    """Positions of the cells in the first stream of a one-sequence state, in cell order."""
    if len(state) < HEADER.size:
        return np.zeros(0, dtype=np.int64)
    return cell_table(state)[0]


def cell_table(state: bytes | bytearray | memoryview) -> tuple[np.ndarray, int]:
    """The first stream's cell positions and the offset where the K/V data begins."""
    magic, _seq, n_stream, cell_count = HEADER.unpack_from(state, 0)
    if magic != STATE_MAGIC or n_stream < 1:
        raise ValueError("not a llama.cpp sequence state")
    offset = HEADER.size
    positions = np.empty(cell_count, dtype=np.int64)
    for index in range(cell_count):
        pos, n_seq = struct.unpack_from("<iI", state, offset)
        positions[index] = pos
        offset += 8 + 4 * n_seq
    return positions, offset


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


def cell_keys(state: StateBuffer, n_layer: int, head_dim: int) -> np.ndarray:
    """The K rows of a one-sequence state, (n_layer, n_cells, n_embd_k) float32, in the model's
    own basis: a quantized K (q8_0) is dequantized and llama.cpp's rotation undone."""
    parts = StateParts(state)
    if parts.n_layer != n_layer:
        raise ValueError(f"state has {parts.n_layer} layers, the model {n_layer}")
    return np.stack([_float_keys(parts.layers[layer], parts.layer_type(layer), head_dim) for layer in range(n_layer)])


def _float_keys(rows: np.ndarray, type_id: int, head_dim: int) -> np.ndarray:
    """One layer's stored K rows as float32. llama.cpp (since the attention-rotation change it
    ships in 0.3.36) stores a quantized K multiplied per head by an orthonormal Walsh-Hadamard
    matrix, so that outliers quantize better, and rotates the queries alike: q·k is unchanged. The
    keys are rotated back here because the probe pairs them with the unrotated `Qcur` queries."""
    from gguf import GGMLQuantizationType  # here: gguf takes 65 ms to import, and only flash attention's scoring reads keys back
    from gguf.quants import dequantize

    try:
        quant_type = GGMLQuantizationType(type_id)
        keys = dequantize(rows, quant_type).reshape(len(rows), -1).astype(np.float32, copy=False)
    except (ValueError, NotImplementedError) as error:
        raise ValueError(f"K cache type {type_id} cannot be read back") from error
    if quant_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) or not _keys_rotated(head_dim):
        return keys
    size = head_dim & -head_dim  # the largest power of two dividing head_dim (≥ 64 here)
    return (keys.reshape(len(rows), -1, size) @ _walsh_hadamard(size)).reshape(len(rows), -1)


def _keys_rotated(head_dim: int) -> bool:
    """llama.cpp's rule for a quantized K: heads of a multiple of 64, unless the variable below is set."""
    return head_dim % 64 == 0 and not int(os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") or 0)


def _walsh_hadamard(size: int) -> np.ndarray:
    """Sylvester's construction, scaled to be orthonormal; it is symmetric and its own inverse."""
    matrix = np.ones((1, 1), dtype=np.float32)
    while len(matrix) < size:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return matrix / np.float32(np.sqrt(size))


class StateParts:
    """A one-stream, one-sequence state read: its cell table and each layer's header and data, as
    views of its bytes. After the cell table: u32 v_trans, u32 n_layer; per layer (K's, then V's)
    i32 ggml type, u64 row bytes and one row per cell, in cell order; a transposed V (v_trans,
    flash attention off) per layer i32 type, u32 element bytes, u32 n_embd_v and for each of the
    n_embd_v dimensions one element per cell."""

    def __init__(self, state: StateBuffer) -> None:
        self.layers_start, self.n_cells, self.n_layer, self.v_trans = self.prefix(state)
        self.seq = HEADER.unpack_from(state, 0)[1]
        self.cell_bytes = bytes(state[HEADER.size : self.layers_start - LAYOUT.size])
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
        v_trans, n_layer = LAYOUT.unpack_from(state, offset)
        return offset + LAYOUT.size, len(positions), n_layer, v_trans

    @staticmethod
    def layer_size(state: StateBuffer, offset: int, n_cells: int, transposed: bool) -> tuple[int, int]:
        """The header's and the data's bytes of the layer at `offset`."""
        if transposed:
            _, element_bytes, n_embd = _COLUMNS.unpack_from(state, offset)
            return _COLUMNS.size, n_embd * n_cells * element_bytes
        _, row_bytes = _ROWS.unpack_from(state, offset)
        return _ROWS.size, n_cells * row_bytes

    def layer_type(self, layer: int) -> int:
        """The ggml type of layer `layer` (K's layers, then V's)."""
        return int.from_bytes(self.layer_headers[layer][:4], "little", signed=True)

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
