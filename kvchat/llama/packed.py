"""A sequence state with its f16 K and V layers stored as q8_0 (34 bytes for 32 values, 53 % of
f16's), for saving a passage bank at about half the size; unpacked to f16 before llama.cpp loads
it. A layer of another type, or whose values do not fill whole blocks of 32, is kept as it is.

Packed: b"KVQ8", then the state's bytes up to its first layer, then per layer one byte (1: q8_0
blocks follow, 0: the layer's own bytes) and the layer as its header and data (state.py's reading
of the layout).
"""

from __future__ import annotations

import numpy as np

from kvchat.llama.state import StateBuffer, StateParts

PACKED_MAGIC = b"KVQ8"
_F16 = 1  # ggml's type id of f16 (GGMLQuantizationType.F16)
_BLOCK = 32  # q8_0's values per block
_BLOCK_BYTES = 34


def packed_state(state: StateBuffer) -> bytes:
    """`state` with its f16 layers as q8_0 blocks."""
    from gguf import GGMLQuantizationType  # here: gguf takes 65 ms to import, and few banks are packed
    from gguf.quants import quantize

    piece = StateParts(state)
    out = [PACKED_MAGIC, bytes(memoryview(state)[: piece.layers_start])]
    for header, data in zip(piece.layer_headers, piece.layers):
        values = data.view(np.float16).reshape(-1) if _packs(header, data) else None
        if values is None:
            out += [b"\0", header, data.tobytes()]
        else:
            blocks = quantize(values.astype(np.float32).reshape(-1, _BLOCK), GGMLQuantizationType.Q8_0)
            out += [b"\1", header, blocks.tobytes()]
    return b"".join(out)


def unpacked_state(packed: StateBuffer) -> bytes:
    """The state packed_state() packed, f16 again (q8_0's rounding aside). ValueError where `packed`
    is not one."""
    view = memoryview(packed)
    if bytes(view[:4]) != PACKED_MAGIC:
        raise ValueError("not a packed state")
    return _Unpacker(view[4:]).state()


def _packs(header: bytes, data: np.ndarray) -> bool:
    return int.from_bytes(header[:4], "little", signed=True) == _F16 and data.size % (2 * _BLOCK) == 0


class _Unpacker:
    """Reads a packed state's layers back: the same walk as StateParts, with q8_0 blocks where flagged."""

    def __init__(self, view: memoryview) -> None:
        self.view = view

    def state(self) -> bytes:
        from gguf import GGMLQuantizationType  # here: gguf takes 65 ms to import, and few banks are packed
        from gguf.quants import dequantize

        # The prefix (header, cell table, layout) parses as a state of no layers' data: read its
        # layer count and walk the layers from there.
        prefix_end, n_cells, n_layer, v_trans = StateParts.prefix(self.view)
        out, offset = [bytes(self.view[:prefix_end])], prefix_end
        for layer in range(2 * n_layer):
            flag = self.view[offset]
            header_size, size = StateParts.layer_size(self.view, offset + 1, n_cells, transposed=bool(v_trans) and layer >= n_layer)
            header = bytes(self.view[offset + 1 : offset + 1 + header_size])
            offset += 1 + header_size
            if flag:
                stored = size // 2 // _BLOCK * _BLOCK_BYTES
                blocks = np.frombuffer(self.view, dtype=np.uint8, count=stored, offset=offset).reshape(-1, _BLOCK_BYTES)
                out += [header, dequantize(blocks, GGMLQuantizationType.Q8_0).astype(np.float16).tobytes()]
            else:
                stored = size
                out += [header, bytes(self.view[offset : offset + size])]
            offset += stored
        if offset != len(self.view):
            raise ValueError("a packed state of the wrong length")
        return b"".join(out)
