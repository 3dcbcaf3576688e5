"""A sequence state with its f16 K and V layers stored as blocks of a smaller ggml type, for saving
a passage bank at half the size or less; unpacked to f16 before llama.cpp loads it. q8_0 takes 34
bytes for 32 values (53 % of f16's), q5_0 22 and q4_0 18; K and V may each have their own. A layer
of another type, or whose values do not fill whole blocks of 32, is kept as it is.

Packed: b"KVQ8", then the state's bytes up to its first layer, then per layer one byte (the ggml
type of the blocks that follow, or 0: the layer's own bytes) and the layer as its header and data
(state.py's reading of the layout).
"""

from __future__ import annotations

import numpy as np

from kvchat.llama.state import StateBuffer, StateParts

PACKED_MAGIC = b"KVQ8"
PACK_TYPES = ("q8_0", "q5_0", "q4_0")  # gguf's names (GGMLQuantizationType, gguf.quants) in lower case
_F16 = 1  # ggml's type id of f16
_BLOCK = 32  # the values per block of each type above


def packed_state(state: StateBuffer, k_type: str = "q8_0", v_type: str = "q8_0") -> bytes:
    """`state` with its f16 K layers as `k_type` blocks and its V layers as `v_type` blocks."""
    from gguf import GGMLQuantizationType  # here: gguf takes 65 ms to import, and few banks are packed
    from gguf.quants import quantize

    if not {k_type, v_type} <= set(PACK_TYPES):
        raise ValueError(f"packs only as {', '.join(PACK_TYPES)}")
    piece = StateParts(state)
    out = [PACKED_MAGIC, bytes(memoryview(state)[: piece.layers_start])]
    for layer, (header, data) in enumerate(zip(piece.layer_headers, piece.layers)):
        values = data.view(np.float16).reshape(-1) if _packs(header, data) else None
        if values is None:
            out += [b"\0", header, data.tobytes()]
        else:
            kind = GGMLQuantizationType[(k_type if layer < piece.n_layer else v_type).upper()]
            blocks = quantize(values.astype(np.float32).reshape(-1, _BLOCK), kind)
            out += [bytes([kind.value]), header, blocks.tobytes()]
    return b"".join(out)


def unpacked_state(packed: StateBuffer) -> bytes:
    """The state packed_state() packed, f16 again (its blocks' rounding aside). ValueError where
    `packed` is not one."""
    view = memoryview(packed)
    if bytes(view[:4]) != PACKED_MAGIC:
        raise ValueError("not a packed state")
    return _Unpacker(view[4:]).state()


def _packs(header: bytes, data: np.ndarray) -> bool:
    return int.from_bytes(header[:4], "little", signed=True) == _F16 and data.size > 0 and data.size % (2 * _BLOCK) == 0


class _Unpacker:
    """Reads a packed state's layers back: the same walk as StateParts, with blocks where flagged."""

    def __init__(self, view: memoryview) -> None:
        self.view = view

    def state(self) -> bytes:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # here: gguf takes 65 ms to import, and few banks are packed
        from gguf import quants

        # The types' own block readers, on every block at once: gguf's dequantize() reads rows in
        # groups, five times slower on a follow-up's passages (0.2 s against 1.1 s for 14M values).
        readers = {GGMLQuantizationType[name.upper()].value: getattr(quants, name.upper()) for name in PACK_TYPES}

        # The prefix (header, cell table, layout) parses as a state of no layers' data: read its
        # layer count and walk the layers from there.
        prefix_end, n_cells, n_layer, v_trans = StateParts.prefix(self.view)
        out, offset = [bytes(self.view[:prefix_end])], prefix_end
        for layer in range(2 * n_layer):
            kind = self.view[offset]
            header_size, size = StateParts.layer_size(self.view, offset + 1, n_cells, transposed=bool(v_trans) and layer >= n_layer)
            header = bytes(self.view[offset + 1 : offset + 1 + header_size])
            offset += 1 + header_size
            if kind:
                if kind not in readers:
                    raise ValueError(f"a packed layer of unknown type {kind}")
                block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)][1]
                stored = size // 2 // _BLOCK * block_bytes
                blocks = np.frombuffer(self.view, dtype=np.uint8, count=stored, offset=offset).reshape(-1, block_bytes)
                out += [header, readers[kind].dequantize_blocks(blocks).astype(np.float16).tobytes()]
            else:
                stored = size
                out += [header, bytes(self.view[offset : offset + size])]
            offset += stored
        if offset != len(self.view):
            raise ValueError("a packed state of the wrong length")
        return b"".join(out)
