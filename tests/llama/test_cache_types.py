"""Quantized KV caches (--cache-type-k/v q8_0) with pruning, compaction, saved readings and both
attention probes, on the tiny GGUF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import load_document
from kvchat.engine import AskSettings, Engine, KvLayout
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.prompt import chat_tokens
from kvchat.errors import SettingsError
from kvchat.events import Done, Notice
from kvchat.llama import ContextSettings, LlamaContext
from kvchat.llama.state import cell_keys
from kvchat.policy import SnapKV

from tests.inspect_helpers import last_logits

POLICY = SnapKV(budget=96, window=16, spans="none")


@pytest.fixture
def prompt(tiny_model) -> list[int]:
    rng = np.random.default_rng(5)
    text = " ".join(rng.choice(["the", "cat", "sat", "on", "7", "42", "mat", "then"], size=300))
    return chat_tokens(tiny_model, [{"role": "user", "content": text}])


def _pruned(model, tokens: list[int], **context: object) -> KvCache:
    cache = KvCache(LlamaContext(model, ContextSettings(n_ctx=2048, threads=2, **context)))
    cache.decode(tokens[:-16])
    votes = cache.observe(tokens[-16:])
    cache.keep_cells(cache.plan(POLICY, POLICY.window, votes).kept)  # compacts and verifies positions
    return cache


def test_a_quantized_key_cache_prunes_compacts_and_round_trips(wide_model, prompt: list[int]) -> None:
    _round_trip(wide_model, prompt, {"type_k": "q8_0"})


def test_a_quantized_cache_whose_blocks_straddle_two_heads_is_refused(tiny_model) -> None:
    """q8_0 with the tiny model's 16-wide heads: wrong logits on the CPU, an abort on CUDA."""
    for context in ({"type_k": "q8_0"}, {"type_v": "q8_0", "flash_attn": True}):
        with pytest.raises(SettingsError) as refused:
            LlamaContext(tiny_model, ContextSettings(n_ctx=256, threads=2, **context))
        assert str(refused.value) == "a q8_0 KV cache needs attention heads a multiple of 32 values wide; this model's are 16"
        assert refused.value.hint == "use f16 for `cache_type_k` and `cache_type_v`"


@pytest.mark.real_model
def test_a_quantized_v_with_flash_attention_on_the_small_model(small_model_path: Path, tmp_path: Path) -> None:
    """The tiny model's 16-wide heads do not fit q8_0's 32-value blocks inside flash attention."""
    from kvchat.llama import LlamaModel

    with LlamaModel(small_model_path) as model:
        text = " ".join(f"item {i} costs {i * 7} coins." for i in range(60))
        tokens = chat_tokens(model, [{"role": "user", "content": text}])
        _round_trip(model, tokens, {"type_v": "q8_0", "flash_attn": True})
        kept = [_pruned(model, tokens, type_v=type_v, flash_attn=True) for type_v in ("f16", "q8_0")]
        positions = [cache.positions.copy() for cache in kept]
        for cache in kept:
            cache.ctx.close()
        assert len(np.intersect1d(*positions)) >= 0.9 * len(positions[0])  # a q8_0 V changes little


def _round_trip(tiny_model, prompt: list[int], context: dict) -> None:
    """Prune, compact, save the state, load it into a new context: the same next logits."""
    cache = _pruned(tiny_model, prompt, **context)
    assert cache.cells == POLICY.budget
    cache.decode([prompt[-1]], want_logits=True)
    expected = last_logits(cache.ctx)
    state, positions, tokens = cache.state(), cache.positions, cache.tokens
    copy = KvCache(LlamaContext(tiny_model, ContextSettings(n_ctx=2048, threads=2, **context)))
    copy.load(state, positions[:-1], tokens[:-1])
    copy.ctx.remove(0, int(positions[-1]), -1)
    copy.reset(positions[:-1], tokens[:-1])
    copy.decode([prompt[-1]], want_logits=False)
    copy.ctx.remove(0, int(positions[-1]), -1)
    copy.ctx.decode([prompt[-1]], int(positions[-1]), want_logits=True)
    np.testing.assert_allclose(last_logits(copy.ctx), expected, atol=1e-4)
    cache.ctx.close()
    copy.ctx.close()


def _keys_read_back(model, tokens: list[int], type_k: str) -> np.ndarray:
    with LlamaContext(model, ContextSettings(n_ctx=2048, threads=2, type_k=type_k)) as ctx:
        ctx.decode(tokens[:500], 0, want_logits=False)
        return cell_keys(ctx.state_bytes(), model.shape.n_layer, model.shape.head_dim)


def test_quantized_keys_read_back_from_a_state_match_the_f16_ones(wide_model, prompt: list[int]) -> None:
    """Layer 0 only: in a random-weight model the quantization error of one layer's keys grows
    through the next layers (0.95 at layer 1), while layer 0's keys come from the same input."""
    f16_keys, q8_keys = (_keys_read_back(wide_model, prompt, type_k) for type_k in ("f16", "q8_0"))
    assert q8_keys.shape == f16_keys.shape
    assert np.corrcoef(f16_keys[0].ravel(), q8_keys[0].ravel())[0, 1] > 0.9999


@pytest.mark.real_model
def test_rotated_quantized_keys_are_rotated_back(small_model_path: Path) -> None:
    """llama.cpp stores a q8_0 K of 64-wide heads Hadamard-rotated; read back unrotated, the keys
    would not correlate with the f16 ones at all (about 0.05 measured)."""
    from kvchat.llama import LlamaModel

    with LlamaModel(small_model_path) as model:
        tokens = model.tokenize(" ".join(f"item {i} costs {i * 7} coins." for i in range(40)))
        f16_keys, q8_keys = (_keys_read_back(model, tokens, type_k) for type_k in ("f16", "q8_0"))
    for layer in range(len(f16_keys)):
        assert np.corrcoef(f16_keys[layer].ravel(), q8_keys[layer].ravel())[0, 1] > 0.99, layer


def test_a_quantized_v_cache_needs_flash_attention() -> None:
    with pytest.raises(SettingsError, match="needs flash attention"):
        KvLayout(type_v="q8_0")
    with pytest.raises(SettingsError, match="unknown `cache_type_k` 'q4_0'"):
        AskSettings(layout=KvLayout(type_k="q4_0"))
    assert AskSettings(layout=KvLayout(True, "q8_0", "q8_0")).layout.type_v == "q8_0"


def test_readings_of_each_cache_type_are_saved_apart_and_reloaded(wide_model_path: Path, tmp_path: Path) -> None:
    document = tmp_path / "notes.txt"
    document.write_text("The boat was named the Grey Heron. " * 80, encoding="utf-8")
    with Engine(str(wide_model_path)) as engine:
        notices = []
        for cache_type_k in ("f16", "q8_0", "q8_0"):
            settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, layout=KvLayout(type_k=cache_type_k))
            events = list(engine.ask(load_document(document), "Boat?", settings))
            assert isinstance(events[-1], Done)
            notices.append([e.text for e in events if isinstance(e, Notice)])
            kv_bytes = events[-1].stats.kv_bytes_full
        assert len(engine.states.store.entries()) == 2
        assert notices[1] == [] and any("loaded the saved reading" in text for text in notices[2])
        f16_bytes = engine.model.shape.kv_bytes_per_token() * events[-1].stats.prompt_tokens
        assert kv_bytes < f16_bytes  # q8_0 keys are counted at their size


def test_each_cache_types_block_is_ggmls() -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from kvchat.llama.model import CACHE_TYPE_BLOCK, CACHE_TYPE_BYTES

    assert CACHE_TYPE_BLOCK == {name: GGML_QUANT_SIZES[GGMLQuantizationType(type_id)][0] for name, (type_id, _) in CACHE_TYPE_BYTES.items()}
