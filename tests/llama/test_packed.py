"""A state packed with q8_0 layers (llama/packed.py) on the tiny model: half the bytes, the same
cells, and logits within q8_0's rounding of the f16 state's."""

from __future__ import annotations

import numpy as np
import pytest

from kvchat.engine.kvcache.cache import KvCache
from kvchat.llama import ContextSettings, LlamaContext
from kvchat.llama.packed import packed_state, unpacked_state
from kvchat.llama.state import cell_positions

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


def test_a_packed_state_is_about_half_the_size_and_answers_within_q8_0_rounding(tiny_model) -> None:
    cache = _cache(tiny_model)
    with cache.ctx:
        cache.decode(PROMPT)
        state = cache.state()
    packed = packed_state(state)
    unpacked = unpacked_state(packed)
    assert len(unpacked) == len(state) and np.array_equal(cell_positions(unpacked), np.arange(len(PROMPT)))
    assert 0.5 < len(packed) / len(state) < 0.56  # 34 bytes for 32 values where f16 takes 64
    expected = _logits_after(tiny_model, None)
    difference = np.abs(_logits_after(tiny_model, unpacked) - expected).max()
    assert 0 < difference < 0.05 * np.abs(expected).max()  # q8_0 rounds, but no more than that


def test_what_is_not_a_packed_state_is_refused(tiny_model) -> None:
    with pytest.raises(ValueError, match="not a packed state"):
        unpacked_state(b"KVCHATST")
    cache = _cache(tiny_model)
    with cache.ctx:
        cache.decode(PROMPT[:40])
        packed = packed_state(cache.state())
    with pytest.raises(ValueError, match="wrong length"):
        unpacked_state(packed + b"\0")
