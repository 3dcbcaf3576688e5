"""llama.cpp mechanics on a tiny random-weight GGUF: shapes, counts, positions and logits."""

from __future__ import annotations

import numpy as np
import pytest

from kvchat.engine import AskSettings
from kvchat.engine.reading.sizing import context_size
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.prompt import chat_tokens
from kvchat.errors import ModelError
from kvchat.events import Done, Pruned
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel
from kvchat.policy import SnapKV

from tests.inspect_helpers import RowMassProbe, drop_runs, last_logits, seq_pos_range
from tests.tiny_gguf import N_HEAD, N_LAYER

WINDOW = 16


@pytest.fixture
def prompt(tiny_model) -> list[int]:
    rng = np.random.default_rng(1)
    words = ["the", "cat", "sat", "on", "a", "mat", "in", "here", "7", "42", "when", "then"]
    text = " ".join(rng.choice(words, size=260))
    tokens = chat_tokens(tiny_model, [{"role": "user", "content": text}])
    assert len(tokens) > 400
    return tokens


def _cache(model, n_ctx: int = 2048) -> KvCache:
    return KvCache(LlamaContext(model, ContextSettings(n_ctx=n_ctx, n_batch=256, threads=2)))


def _read_prefix(cache: KvCache, tokens: list[int]) -> int:
    prefix = len(tokens) - WINDOW
    cache.decode(tokens[:prefix])
    return prefix


def _pruned_cache(model, tokens: list[int], budget: int, compact: bool) -> tuple[KvCache, object]:
    """Read, observe and plan; remove the dropped runs, compacting only if asked."""
    cache = _cache(model)
    prefix = _read_prefix(cache, tokens)
    votes = cache.observe(tokens[prefix:])
    plan = cache.plan(SnapKV(budget=budget, window=WINDOW), WINDOW, votes)
    if compact:
        cache.keep_cells(plan.kept)
    else:
        cache.ctx.remove_runs(0, drop_runs(plan))
    return cache, plan


def test_probe_shape_and_rows_sum_to_one(tiny_model, prompt, monkeypatch) -> None:
    monkeypatch.setattr("kvchat.llama.context.AttentionProbe", RowMassProbe)  # the probe the context builds
    cache = _cache(tiny_model)
    with cache.ctx as ctx:
        prefix = _read_prefix(cache, prompt)
        votes = cache.observe(prompt[prefix:])
        assert votes.shape == (N_LAYER, N_HEAD, len(prompt))
        assert np.allclose(ctx.probe.row_mass(), 1.0, atol=1e-4)
        assert np.allclose(votes.sum(axis=-1), WINDOW, atol=1e-3)
        # causal: no window query attends to a position after it, so the last column gets one vote row
        assert np.all(votes[..., -1] <= 1.0 + 1e-5)


def test_probe_is_inactive_outside_observation(tiny_model, prompt) -> None:
    cache = _cache(tiny_model)
    with cache.ctx as ctx:
        prefix = _read_prefix(cache, prompt)
        cache.decode(prompt[prefix:])
        with pytest.raises(Exception):
            ctx.probe.stop()


def test_budget_at_least_prompt_leaves_logits_identical(tiny_model, prompt) -> None:
    plain_cache = _cache(tiny_model)
    with plain_cache.ctx as plain:
        prefix = _read_prefix(plain_cache, prompt)
        plain_cache.decode(prompt[prefix:], want_logits=True)
        expected_first = last_logits(plain)
        plain.decode([5], len(prompt))
        expected_next = last_logits(plain)
    cache, plan = _pruned_cache(tiny_model, prompt, budget=len(prompt) + 10, compact=True)
    with cache.ctx as ctx:
        assert len(plan.kept) == len(prompt) and drop_runs(plan) == []
        assert np.array_equal(last_logits(ctx), expected_first)
        ctx.decode([5], len(prompt))
        assert np.array_equal(last_logits(ctx), expected_next)


def test_compaction_keeps_logits_within_float_noise(tiny_model, prompt) -> None:
    holes_cache, _ = _pruned_cache(tiny_model, prompt, budget=96, compact=False)
    dense_cache, plan = _pruned_cache(tiny_model, prompt, budget=96, compact=True)
    with holes_cache.ctx as holes, dense_cache.ctx as dense:
        for step, token in enumerate([5, 17, 99]):
            holes.decode([token], len(prompt) + step)
            dense.decode([token], len(prompt) + step)
            assert np.allclose(last_logits(holes), last_logits(dense), atol=1e-4, rtol=1e-4)
    assert len(plan.kept) == 96


def test_pruning_really_changes_the_cache(tiny_model, prompt) -> None:
    full_cache = _cache(tiny_model)
    pruned_cache, _ = _pruned_cache(tiny_model, prompt, budget=64, compact=True)
    with full_cache.ctx as full_ctx, pruned_cache.ctx as pruned:
        prefix = _read_prefix(full_cache, prompt)
        full_cache.decode(prompt[prefix:])
        full_ctx.decode([5], len(prompt))
        pruned.decode([5], len(prompt))
        assert not np.allclose(last_logits(full_ctx), last_logits(pruned), atol=1e-3)


def test_kept_count_and_positions_match_plan(tiny_model, prompt) -> None:
    cache = _cache(tiny_model)
    with cache.ctx as ctx:
        prefix = _read_prefix(cache, prompt)
        votes = cache.observe(prompt[prefix:])
        plan = SnapKV(budget=100, window=WINDOW, spans="none").plan(votes.shape[-1], WINDOW, votes)
        cache.keep_cells(plan.kept)  # verifies positions itself; check again from outside
        positions = ctx.positions()
        assert len(positions) == 100
        assert np.array_equal(positions, plan.kept)
        assert seq_pos_range(ctx) == (0, len(prompt) - 1)
        ctx.decode([5], len(prompt))
        assert ctx.positions()[-1] == len(prompt) and len(ctx.positions()) == 101


def _answer(tiny_model, prompt: list[int], settings: AskSettings) -> tuple[Done, list]:
    with PromptRun(tiny_model, context_size(tiny_model, len(prompt), settings), settings, "tiny") as run:
        events = list(run.read(prompt, len(prompt) - settings.method.window))
        selection = run.select(prompt, settings)
        while True:  # select() returns what answer() takes once its events are through
            try:
                events.append(next(selection))
            except StopIteration as finished:
                events += list(run.answer(settings, finished.value))
                break
    return events[-1], events


def test_greedy_output_is_deterministic(tiny_model, prompt) -> None:
    settings = AskSettings(method=SnapKV(budget=128, window=WINDOW), max_tokens=24, threads=2)
    first, events = _answer(tiny_model, prompt, settings)
    second, _ = _answer(tiny_model, prompt, settings)
    assert first.answer == second.answer
    assert first.stats.kept_tokens == 128 and first.stats.prompt_tokens == len(prompt)
    pruned = [e for e in events if isinstance(e, Pruned)]
    assert len(pruned) == 1 and len(pruned[0].kept_positions) == 128


def test_short_prompt_is_not_pruned(tiny_model, prompt) -> None:
    done, events = _answer(tiny_model, prompt, AskSettings(max_tokens=4, threads=2))
    assert done.stats.kept_tokens == done.stats.prompt_tokens == len(prompt)
    assert not any(isinstance(e, Pruned) for e in events)


def test_seeded_sampling_is_reproducible(tiny_model, prompt) -> None:
    from kvchat.llama import SamplerSettings

    settings = AskSettings(
        method=SnapKV(budget=128, window=WINDOW), max_tokens=16, threads=2,
        sampler=SamplerSettings(temperature=0.9, seed=7),
    )
    assert _answer(tiny_model, prompt, settings)[0].answer == _answer(tiny_model, prompt, settings)[0].answer


def test_detokenizer_never_splits_utf8(tiny_model) -> None:
    from kvchat.llama import Detokenizer

    text = "naïve café ☕ 数据"
    tokens = tiny_model.tokenize(text)
    detokenizer = Detokenizer(tiny_model)
    pieces = [detokenizer.feed(t) for t in tokens] + [detokenizer.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_chat_template_comes_from_the_gguf(tiny_model) -> None:
    rendered = tiny_model.apply_chat_template([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tokens = tiny_model.tokenize(rendered, special=True)
    assert tokens[0] == tiny_model.tokenize("<|im_start|>", special=True)[0]
    assert len(tiny_model.tokenize("<|im_start|>", special=True)) == 1


@pytest.mark.parametrize("gpu_layers, hint", [
    (0, "is it a complete GGUF file?"),
    (99, "is it a complete GGUF file, and do its `gpu_layers` fit the GPU's free memory?"),
])
def test_a_model_cut_short_is_refused_with_llama_cpps_reason(tiny_model_path, tmp_path, gpu_layers, hint) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model_path.read_bytes()[:300_000])  # the header whole, the last tensors missing
    with pytest.raises(ModelError) as refused:
        LlamaModel(cut, gpu_layers=gpu_layers)
    assert refused.value.message == (f"{cut}: llama.cpp could not load this model: tensor 'blk.1.attn_q.weight' data "
                                     "is not within the file bounds, model is corrupted or incomplete")
    assert refused.value.hint == hint


def _stopping_at_call(call: int) -> tuple[list[int], object]:
    """A stop() that turns true at its `call`-th question: llama.cpp asks between graph nodes."""
    asked = [0]

    def stop() -> bool:
        asked[0] += 1
        return asked[0] >= call

    return asked, stop


def test_a_batch_stopped_part_way_leaves_the_cache_as_before_it_and_is_read_again_alike(tiny_model, prompt) -> None:
    half, settings = len(prompt) // 2, ContextSettings(n_ctx=1024, n_batch=512, threads=2)
    with LlamaContext(tiny_model, settings) as straight:
        straight.decode(prompt[:half], 0, want_logits=False)
        straight.decode(prompt[half:half + 200], half, want_logits=False)
        straight.decode([5], half + 200)
        expected = last_logits(straight)
    with LlamaContext(tiny_model, settings) as ctx:
        ctx.decode(prompt[:half], 0, want_logits=False)
        asked, stop = _stopping_at_call(20)
        assert ctx.decode_unless(prompt[half:half + 200], half, stop) is False
        assert asked[0] == 20  # asked between the graph's nodes, and stopped there, part-way
        assert np.array_equal(np.sort(ctx.positions()), np.arange(half))  # none of the batch's cells stay
        assert ctx.decode_unless(prompt[half:half + 200], half, lambda: False) is True
        assert np.array_equal(np.sort(ctx.positions()), np.arange(half + 200))
        ctx.decode([5], half + 200)
        assert np.allclose(last_logits(ctx), expected, atol=1e-5, rtol=1e-5)


def test_what_a_stop_raises_is_raised_once_the_batch_is_read(tiny_model, prompt) -> None:
    def broken() -> bool:
        raise OSError("too many open files")

    with LlamaContext(tiny_model, ContextSettings(n_ctx=1024, n_batch=512, threads=2)) as ctx:
        with pytest.raises(OSError, match="too many open files"):  # ctypes alone would print it and go on
            ctx.decode_unless(prompt[:200], 0, broken)
        assert np.array_equal(np.sort(ctx.positions()), np.arange(200))


def test_a_decode_that_applies_a_shift_is_not_stopped_part_way(tiny_model, prompt) -> None:
    """llama.cpp applies a shift at the start of the next decode, and a stop within it would leave
    it to be applied again to the layers already shifted."""
    with LlamaContext(tiny_model, ContextSettings(n_ctx=1024, n_batch=512, threads=2)) as ctx:
        ctx.decode(prompt[:200], 0, want_logits=False)
        ctx.remove(0, 0, 100)
        ctx.shift(0, 100, 200, -100)
        assert ctx.decode_unless(prompt[200:300], 100, lambda: True) is True
        assert ctx.decode_unless(prompt[300:400], 200, lambda: True) is False  # the shift was applied
        assert np.array_equal(np.sort(ctx.positions()), np.arange(200))
