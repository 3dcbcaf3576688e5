"""A state packed with q8_0, q5_0 or q4_0 layers (llama/packed.py) on the tiny model: the blocks'
bytes, the same cells, and logits within the blocks' rounding of the f16 state's."""

from __future__ import annotations

import numpy as np
import pytest

from kvchat.engine.kvcache.cache import KvCache
from kvchat.llama import ContextSettings, LlamaContext
from kvchat.llama.packed import PACK_TYPES, PACKED_MAGIC, packed_state, unpacked_state
from kvchat.llama.state import StateParts, cell_positions

from tests.inspect_helpers import last_logits

PROMPT = [(7 * index) % 200 + 3 for index in range(300)]
QUESTION = [5, 9, 13, 17]


def _cache(model) -> KvCache:
    return KvCache(LlamaContext(model, ContextSettings(n_ctx=1024, n_batch=256, threads=2)))


def _logits_after(model, state: bytes | None) -> np.ndarray:
    cache = _cache(model)
    with cache.ctx:
        if state is None:
            cache.decode(PROMPT)
        else:
            cache.load(state, np.arange(len(PROMPT)), np.asarray(PROMPT))
        cache.decode(QUESTION, want_logits=True)
        return last_logits(cache.ctx)


@pytest.mark.parametrize("k_type, v_type, share", [("q8_0", "q8_0", 34 / 64), ("q8_0", "q4_0", (34 + 18) / 128),
                                                   ("q4_0", "q4_0", 18 / 64), ("q5_0", "q5_0", 22 / 64)])
def test_a_packed_state_takes_its_blocks_bytes_and_answers_within_their_rounding(tiny_model, k_type, v_type, share) -> None:
    cache = _cache(tiny_model)
    with cache.ctx:
        cache.decode(PROMPT)
        state = cache.state()
    packed = packed_state(state, k_type, v_type)
    unpacked = unpacked_state(packed)
    assert len(unpacked) == len(state) and np.array_equal(cell_positions(unpacked), np.arange(len(PROMPT)))
    assert share < len(packed) / len(state) < share + 0.05  # the blocks, and the state's cell table (4.5 % here) and headers
    expected = _logits_after(tiny_model, None)
    difference = np.abs(_logits_after(tiny_model, unpacked) - expected).max()
    assert 0 < difference < (0.05 if k_type == v_type == "q8_0" else 0.2) * np.abs(expected).max()  # rounded, no more


def test_what_is_not_a_packed_state_is_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match="not a packed state"):
        unpacked_state(b"KVCHATST")
    cache = _cache(tiny_model)
    with cache.ctx:
        cache.decode(PROMPT[:40])
        packed = packed_state(cache.state())
    with pytest.raises(ValueError, match="wrong length"):
        unpacked_state(packed + b"\0")


@pytest.mark.parametrize("name", PACK_TYPES)
def test_a_layer_is_packed_into_the_blocks_gguf_writes_and_read_back_as_gguf_reads_them(tiny_model, name) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    cache = _cache(tiny_model)
    with cache.ctx:
        cache.decode(PROMPT)
        state = cache.state()
    parts = StateParts(state)
    kind = GGMLQuantizationType[name.upper()]
    values = parts.layers[0].view(np.float16).reshape(-1)  # the first K layer
    expected = quantize(values.astype(np.float32).reshape(-1, 32), kind)
    packed = packed_state(state, name, name)
    flag = len(PACKED_MAGIC) + parts.layers_start
    assert packed[flag] == PACK_TYPES[name] == kind.value
    start = flag + 1 + len(parts.layer_headers[0])
    assert packed[start : start + expected.nbytes] == expected.tobytes()
    unpacked = StateParts(unpacked_state(packed)).layers[0].view(np.float16).reshape(-1)
    np.testing.assert_array_equal(unpacked, dequantize(expected, kind).astype(np.float16).reshape(-1))
