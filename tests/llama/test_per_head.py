"""SnapKV per head (--heads per-head): each layer and KV head keeps its own tokens in llama.cpp's
shared cells (llama/composite.py), on the tiny GGUF: positions, counts and logits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document
from kvchat.engine import SELECTIONS, AskSettings, Conversation
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.prompt import chat_tokens
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.answering import route
from kvchat.errors import SettingsError
from kvchat.events import Evicted, Pruned
from kvchat.llama import ContextSettings, LlamaContext
from kvchat.policy import SnapKV

from tests.inspect_helpers import OutputProbe, cell_values, last_logits, returned
from tests.tiny_gguf import N_HEAD, N_HEAD_KV, N_LAYER

POLICY = SnapKV(budget=96, window=16, spans="none")
LAYOUTS = {"flash attention off": {}, "flash attention on": {"flash_attn": True}}
# flash attention sums the cells in another order once they move: differences at its own rounding
LOGIT_NOISE = {"flash attention off": 1e-5, "flash attention on": 5e-3}


@pytest.fixture
def prompt(tiny_model) -> list[int]:
    rng = np.random.default_rng(11)
    text = " ".join(rng.choice(["the", "cat", "sat", "on", "7", "42", "mat", "then", "here"], size=300))
    return chat_tokens(tiny_model, [{"role": "user", "content": text}])


def _read(model, tokens: list[int], **context: object) -> KvCache:
    """A cache that read all of `tokens` but the last one."""
    cache = KvCache(LlamaContext(model, ContextSettings(n_ctx=2048, n_batch=512, threads=2, **context)))
    cache.decode(tokens[:-1])
    return cache


def _shared_plan(model, tokens: list[int], **context: object) -> np.ndarray:
    """The cells a shared selection keeps of a cache that read all of `tokens` but the last one."""
    cache = KvCache(LlamaContext(model, ContextSettings(n_ctx=2048, n_batch=512, threads=2, **context)))
    with cache.ctx:
        cache.decode(tokens[: -POLICY.window])
        votes = cache.observe(tokens[-POLICY.window : -1])
        return cache.plan(POLICY, POLICY.window - 1, votes).kept


def _own_cells(n_cells: int, width: int, seed: int) -> np.ndarray:
    """(n_layer, n_head_kv, width) sorted cells, a different random set per head, each with the
    first 4 and the last 8 cells (sinks and window, as a selection pins them)."""
    rng = np.random.default_rng(seed)
    pinned = np.r_[0:4, n_cells - 8 : n_cells]
    middle = np.arange(4, n_cells - 8)
    rows = [np.sort(np.r_[pinned, rng.choice(middle, width - len(pinned), replace=False)])
            for _ in range(N_LAYER * N_HEAD_KV)]
    return np.stack(rows).reshape(N_LAYER, N_HEAD_KV, width)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_head_keeping_the_same_cells_equals_a_shared_compaction(tiny_model, prompt: list[int], layout: str) -> None:
    kept = _shared_plan(tiny_model, prompt, **LAYOUTS[layout])
    shared, own = _read(tiny_model, prompt, **LAYOUTS[layout]), _read(tiny_model, prompt, **LAYOUTS[layout])
    with shared.ctx as shared_ctx, own.ctx as own_ctx:
        shared.keep_cells(kept)
        dropped = own.keep_per_head(np.broadcast_to(kept, (N_LAYER, N_HEAD_KV, len(kept))).copy())
        assert len(dropped) == len(prompt) - 1 - len(kept)
        assert np.array_equal(own.positions, kept) and np.array_equal(own.tokens, shared.tokens)
        assert np.array_equal(own.ctx.positions(0), kept)
        assert own.head_origins is not None and (own.head_origins == kept).all()
        for cache in (shared, own):
            cache.decode(prompt[-1:], want_logits=True)
        np.testing.assert_allclose(last_logits(own_ctx), last_logits(shared_ctx), atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_same_cells_in_another_order_per_head_give_the_same_logits(tiny_model, prompt: list[int], layout: str) -> None:
    """K and V of a head travel together: any per-head order of one kept set is the same cache."""
    kept = _shared_plan(tiny_model, prompt, **LAYOUTS[layout])
    rng = np.random.default_rng(3)
    order = np.stack([rng.permutation(len(kept)) for _ in range(N_LAYER * N_HEAD_KV)]).reshape(N_LAYER, N_HEAD_KV, -1)
    logits = []
    for shuffled in (False, True):
        cache = _read(tiny_model, prompt, **LAYOUTS[layout])
        with cache.ctx as ctx:
            cache.keep_cells(kept)
            if shuffled:
                assert np.array_equal(ctx.compact_per_head(0, order, kept), kept)
            ctx.decode(prompt[-1:], len(prompt) - 1)
            logits.append(last_logits(ctx))
    np.testing.assert_allclose(logits[1], logits[0], atol=LOGIT_NOISE[layout])


def test_heads_keeping_their_own_tokens_attend_as_the_full_cache_masked_to_them(tiny_model, prompt: list[int], monkeypatch) -> None:
    """Layer 0, where the next token's query does not depend on the cache: each query head's
    attention and the attention output equal a numpy reference from the full cache's attention
    and V, with every head masked to its KV head's own cells."""
    monkeypatch.setattr("kvchat.llama.context.AttentionProbe", OutputProbe)
    n_cells, last = len(prompt) - 1, prompt[-1:]
    own_cells = _own_cells(n_cells, 60, seed=5)
    full = _read(tiny_model, prompt)
    with full.ctx:
        full_votes = full.observe(last)[0]  # (n_head, n_cells + 1): the token attends to itself last
        full_values = cell_values(full.state(), N_LAYER)[0]
    own = _read(tiny_model, prompt)
    with own.ctx as own_ctx:
        own.keep_per_head(own_cells)
        assert own.cells == 60 and np.array_equal(own.positions, own_cells.max(axis=(0, 1)))
        assert np.array_equal(own.ctx.positions(0), own.positions) and (own.head_origins == own_cells).all()
        own_votes = own.observe(last)[0]
        output = own_ctx.probe.output[0]
    group, head_dim = N_HEAD // N_HEAD_KV, full_values.shape[1] // N_HEAD_KV
    for head in range(N_HEAD):
        kv_head = head // group
        seen = np.r_[own_cells[0, kv_head], n_cells]  # its own cells, then the token itself
        weights = full_votes[head, seen] / full_votes[head, seen].sum()
        np.testing.assert_allclose(own_votes[head], weights, atol=1e-5)
        values = full_values[seen, kv_head * head_dim : (kv_head + 1) * head_dim]
        # llama.cpp multiplies the f16 V by the weights rounded to f16: agreement to about 1e-3
        np.testing.assert_allclose(output[head * head_dim : (head + 1) * head_dim], weights @ values, atol=2e-3)
    # the shared cache's answer differs: the heads really hold different tokens
    assert not np.allclose(own_votes, full_votes[:, np.r_[own_cells[0, 0], n_cells]], atol=1e-3)


def test_a_quantized_key_cache_keeps_tokens_per_head(wide_model) -> None:
    """q8_0 keeps 32 values per block: heads 32 wide split whole blocks (narrower heads are
    refused, test_cache_types.py)."""
    model = wide_model
    tokens = chat_tokens(model, [{"role": "user", "content": "the cat sat on 42 mats then " * 30}])
    own_cells = _own_cells(len(tokens) - 1, 48, seed=2)
    cache = _read(model, tokens, type_k="q8_0")
    with cache.ctx as ctx:
        cache.keep_per_head(own_cells)
        state = ctx.state_bytes(0)
        cache.decode(tokens[-1:], want_logits=True)
        expected = last_logits(ctx)
    with LlamaContext(model, ContextSettings(n_ctx=2048, threads=2, type_k="q8_0")) as copy:
        copy.load_state(state, 0)
        copy.decode(tokens[-1:], len(tokens) - 1)
        np.testing.assert_allclose(last_logits(copy), expected, atol=1e-5)


PER_HEAD = AskSettings(method=SnapKV(budget=96, window=16, heads="per-head"), max_tokens=6, threads=2)
BOXES = Document(path=Path("boxes.txt"), kind="text",
                 text=" ".join(f"Line {i}: the code for box {i} is {1000 + i * 7}." for i in range(60)))


@pytest.mark.parametrize("selection", SELECTIONS)
def test_conversations_keep_tokens_per_head_with_earlier_turns_in_every_head(tiny_model, selection: str) -> None:
    conversation = Conversation(tiny_model, "tiny", BOXES, replace(PER_HEAD, select=selection))
    try:
        list(conversation.open())
        answers = []
        for question in ("What is the code for box 3?", "And the code for box 50?"):
            events = list(route.answer(conversation, question))
            answers.append(events[-1])
            cache = conversation.run.cache
            assert cache.head_origins is not None and cache.head_origins.shape == (N_LAYER, N_HEAD_KV, cache.cells)
            assert answers[-1].stats.generated_tokens == 6 and answers[-1].sources  # each head's attention to its own tokens
        pruned = [event for event in events if isinstance(event, Pruned)]
    finally:
        conversation.close()
    if selection == "question":  # the follow-up chose again, with the first turn pinned in every head
        (second,) = pruned
        heads = N_LAYER * N_HEAD_KV
        counts = dict(zip(second.kept_positions, second.kept_heads))
        first_turn = range(len(conversation.document_tokens), answers[0].stats.prompt_tokens)
        assert second.head_count == heads and all(counts[p] == heads for p in first_turn)
        assert min(second.kept_heads) < heads  # and the heads chose differently elsewhere
        assert second.kept_tokens == answers[1].stats.kept_tokens > 96


@pytest.mark.system
def test_the_decode_ring_evicts_answer_cells_after_a_prompt_kept_per_head(tiny_model, monkeypatch) -> None:
    monkeypatch.setattr(tiny_model, "is_end_of_generation", lambda token: False)  # the answer runs to max_tokens
    text = " ".join(f"Box {i} holds {1000 + i * 7}." for i in range(9))
    tokens = chat_tokens(tiny_model, [{"role": "user", "content": text}])
    assert 96 < len(tokens) < 256
    settings = replace(PER_HEAD, max_tokens=300, n_batch=256)
    with PromptRun(tiny_model, 256, settings, "tiny") as run:
        list(run.read(tokens, len(tokens) - 16))
        selected = returned(run.select(tokens, settings))
        prompt_heads = run.cache.head_origins.copy()
        events = list(run.answer(settings, selected))
        cache = run.cache
    assert sum(isinstance(event, Evicted) for event in events) >= 2
    assert events[-1].stats.generated_tokens == 300 and cache.peak_cells <= 256
    assert np.array_equal(cache.head_origins[..., :96], prompt_heads)  # the prompt's cells stay as kept
    answer_heads = cache.head_origins[..., 96:]
    assert (answer_heads == cache.origins[96:]).all()  # answer cells hold one token in every head


def test_a_fast_reading_is_refused_per_head() -> None:
    with pytest.raises(SettingsError, match="not one per head"):
        AskSettings(method=SnapKV(heads="per-head"), read="fast")
