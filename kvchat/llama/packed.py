"""A sequence state with its f16 K and V layers stored as blocks of a smaller ggml type: a passage
bank is held and saved so (engine/reading/passage_bank.py), at half the size or less, and unpacked
to f16 as llama.cpp loads it. q8_0 takes 34 bytes for 32 values (53 % of f16's), q5_0 22 and q4_0
18; K and V may each have their own. ggml writes and reads the blocks (llama/_lib.ggml_blocks), as
it does a quantized cache's. A layer of another type, or whose values do not fill whole blocks of
32, is kept as it is.

Packed: b"KVQ8", then the state's bytes up to its first layer, then per layer one byte (the ggml
type of the blocks that follow, or 0: the layer's own bytes) and the layer as its header and data
(state.py's reading of the layout).
"""

from __future__ import annotations

import numpy as np

from kvchat.llama._lib import ggml_blocks, ggml_cpu_rows
from kvchat.llama.state import StateBuffer, StateParts

PACKED_MAGIC = b"KVQ8"
PACK_TYPES = {"q8_0": 8, "q5_0": 6, "q4_0": 2}  # ggml's names and type ids (enum ggml_type)
_NAMES = {kind: name for name, kind in PACK_TYPES.items()}
_F16 = 1  # ggml's type id of f16
_BLOCK = 32  # the values per block of each type above


def packed_state(state: StateBuffer, k_type: str = "q8_0", v_type: str = "q8_0") -> bytes:
    """`state` with its f16 K layers as `k_type` blocks and its V layers as `v_type` blocks."""
    if not {k_type, v_type} <= set(PACK_TYPES):
        raise ValueError(f"packs only as {', '.join(PACK_TYPES)}")
    piece = StateParts(state)
    out = [PACKED_MAGIC, bytes(memoryview(state)[: piece.layers_start])]
    for layer, (header, data) in enumerate(zip(piece.layer_headers, piece.layers)):
        if _packs(header, data):
            kind = PACK_TYPES[k_type if layer < piece.n_layer else v_type]
            out += [bytes([kind]), header, _blocks(data.view(np.float16).reshape(-1), kind)]
        else:
            out += [b"\0", header, data.tobytes()]
    return b"".join(out)


def unpacked_state(packed: StateBuffer) -> bytearray:
    """The state packed_state() packed, f16 again (its blocks' rounding aside). ValueError where
    `packed` is not one."""
    view = memoryview(packed)
    if bytes(view[:4]) != PACKED_MAGIC:
        raise ValueError("not a packed state")
    prefix_end, layers = _layers(view)
    out = bytearray(prefix_end - 4 + sum(header_size + size for _, _, header_size, size, _ in layers))
    out[: prefix_end - 4] = view[4:prefix_end]
    at = prefix_end - 4
    for kind, offset, header_size, size, stored in layers:
        out[at : at + header_size] = view[offset : offset + header_size]
        at, offset = at + header_size, offset + header_size
        if kind == 0:
            out[at : at + size] = view[offset : offset + size]
        else:
            _unpack(view[offset : offset + stored], kind, np.frombuffer(out, dtype=np.float16, count=size // 2, offset=at))
        at += size
    return out


def _layers(view: memoryview) -> tuple[int, list[tuple[int, int, int, int, int]]]:
    """Where a packed state's layers begin, and each layer's type flag, offset (of its header),
    header size, unpacked size and stored size; ValueError where they do not fill the state."""
    # The prefix (header, cell table, layout) parses as a state of no layers' data: read its layer
    # count and walk the layers from there.
    prefix_end, n_cells, n_layer, v_trans = StateParts.prefix(view[4:])
    layers, offset = [], 4 + prefix_end
    for layer in range(2 * n_layer):
        kind = view[offset]
        if kind and kind not in _NAMES:
            raise ValueError(f"a packed layer of unknown type {kind}")
        header_size, size = StateParts.layer_size(view, offset + 1, n_cells, transposed=bool(v_trans) and layer >= n_layer)
        stored = size // 2 // _BLOCK * ggml_blocks().ggml_type_size(kind) if kind else size
        layers.append((kind, offset + 1, header_size, size, stored))
        offset += 1 + header_size + stored
    if offset != len(view):
        raise ValueError("a packed state of the wrong length")
    return 4 + prefix_end, layers


def _packs(header: bytes, data: np.ndarray) -> bool:
    return int.from_bytes(header[:4], "little", signed=True) == _F16 and data.size > 0 and data.size % (2 * _BLOCK) == 0


def _blocks(values: np.ndarray, kind: int) -> bytes:
    """The f16 `values` as ggml's blocks of type `kind`."""
    wide = np.empty(len(values), dtype=np.float32)
    ggml_cpu_rows().ggml_cpu_fp16_to_fp32(values.ctypes.data, wide.ctypes.data, len(values))
    blocks = np.empty(len(values) // _BLOCK * ggml_blocks().ggml_type_size(kind), dtype=np.uint8)
    ggml_blocks().ggml_quantize_chunk(kind, wide.ctypes.data, blocks.ctypes.data, 0, len(values) // _BLOCK, _BLOCK, None)
    return blocks.tobytes()


def _unpack(blocks: memoryview, kind: int, values: np.ndarray) -> None:
    """ggml's blocks of type `kind` into the f16 `values` they hold."""
    wide = np.empty(len(values), dtype=np.float32)
    read = getattr(ggml_blocks(), f"dequantize_row_{_NAMES[kind]}")
    read(np.frombuffer(blocks, dtype=np.uint8).ctypes.data, wide.ctypes.data, len(values))
    ggml_cpu_rows().ggml_cpu_fp32_to_fp16(wide.ctypes.data, values.ctypes.data, len(values))
