"""Flash attention on: the query probe (queries + cached keys) against the softmax probe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvchat.engine import AskSettings, Engine, KvLayout
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.prompt import chat_tokens
from kvchat.events import Done
from kvchat.documents import load_document
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel
from kvchat.policy import SnapKV

WINDOW = 32


def _votes(
    model: LlamaModel, tokens: list[int], flash_attn: bool, policy: SnapKV, type_k: str = "f16", query_scores: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Votes of the last WINDOW tokens over the prompt, and the cells SnapKV keeps from them."""
    settings = ContextSettings(n_ctx=4096, flash_attn=flash_attn, threads=2, type_k=type_k, query_scores=query_scores)
    cache = KvCache(LlamaContext(model, settings))
    try:
        body = tokens[:-WINDOW]
        for start in range(0, len(body), 512):
            cache.decode(body[start : start + 512])
        votes = cache.observe(tokens[-WINDOW:])
        return votes, cache.plan(policy, policy.window, votes).kept
    finally:
        cache.ctx.close()


def _prompt(model: LlamaModel, text: str, limit: int) -> list[int]:
    return chat_tokens(model, [{"role": "user", "content": text}])[-limit:]


def test_on_one_context_the_query_probe_gives_the_softmax_probes_votes(tiny_model) -> None:
    """Flash attention off for both: the same queries and keys, so the recomputed softmax must
    match the one llama.cpp computed (flash attention itself changes the numbers a little)."""
    rng = np.random.default_rng(4)
    text = " ".join(rng.choice(["the", "cat", "sat", "on", "7", "42", "mat", "then"], size=400))
    tokens = _prompt(tiny_model, text, 600)
    policy = SnapKV(budget=128, window=WINDOW, spans="none")
    softmax_votes, softmax_kept = _votes(tiny_model, tokens, False, policy)
    query_votes, query_kept = _votes(tiny_model, tokens, False, policy, query_scores=True)
    np.testing.assert_allclose(query_votes, softmax_votes, rtol=1e-2, atol=1e-5)  # llama.cpp rounds q to f16
    np.testing.assert_array_equal(query_kept, softmax_kept)


def test_both_probes_give_the_same_kept_set_on_the_tiny_model(tiny_model) -> None:
    rng = np.random.default_rng(3)
    text = " ".join(rng.choice(["the", "cat", "sat", "on", "7", "42", "mat", "then"], size=400))
    tokens = _prompt(tiny_model, text, 600)
    policy = SnapKV(budget=128, window=WINDOW, spans="none")
    softmax_votes, softmax_kept = _votes(tiny_model, tokens, False, policy)
    query_votes, query_kept = _votes(tiny_model, tokens, True, policy)
    assert query_votes.shape == softmax_votes.shape
    assert np.corrcoef(softmax_votes.ravel(), query_votes.ravel())[0, 1] > 0.999
    np.testing.assert_array_equal(query_kept, softmax_kept)


def test_flash_attention_readings_are_saved_apart(tiny_model_path: Path, tmp_path: Path) -> None:
    """V is laid out differently with flash attention on, so its saved readings have other keys."""
    document = tmp_path / "notes.txt"
    document.write_text("The boat was named the Grey Heron. " * 80, encoding="utf-8")
    with Engine(str(tiny_model_path)) as engine:
        for flash_attn in (False, True, False, True):
            settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, layout=KvLayout(flash_attn=flash_attn))
            events = list(engine.ask(load_document(document), "Boat?", settings))
            assert isinstance(events[-1], Done)
        assert len(engine.states.store.entries()) == 2


NEEDLE_POLICY = SnapKV(budget=256, window=WINDOW)


@pytest.fixture(scope="module")
def needle(small_model_path: Path):
    """The small model, a 1.5K-token needle prompt and the softmax probe's reading of it."""
    from kvchat.bench.tasks import needle_case

    with LlamaModel(small_model_path) as model:
        case = needle_case(lambda text: len(model.tokenize(text)), 1500, 0.5, seed=7)
        tokens = _prompt(model, case.document + "\n\n" + case.question, 2000)
        yield model, tokens, _votes(model, tokens, False, NEEDLE_POLICY)


def _overlap(reference: np.ndarray, other: np.ndarray) -> float:
    return len(np.intersect1d(reference, other)) / len(reference)


@pytest.mark.real_model
def test_both_probes_agree_on_the_small_model(needle) -> None:
    model, tokens, (softmax_votes, softmax_kept) = needle
    same_context_votes, same_context_kept = _votes(model, tokens, False, NEEDLE_POLICY, query_scores=True)
    np.testing.assert_allclose(same_context_votes, softmax_votes, rtol=1e-2, atol=1e-4)
    np.testing.assert_array_equal(same_context_kept, softmax_kept)
    query_votes, query_kept = _votes(model, tokens, True, NEEDLE_POLICY)
    assert np.corrcoef(softmax_votes.ravel(), query_votes.ravel())[0, 1] > 0.99
    assert _overlap(softmax_kept, query_kept) >= 0.99


@pytest.mark.real_model
def test_flash_attention_scoring_reads_a_quantized_key_cache(needle) -> None:
    """A q8_0 K is stored rotated (64-wide heads); the probe must rotate it back to score."""
    model, tokens, (softmax_votes, softmax_kept) = needle
    query_votes, query_kept = _votes(model, tokens, True, NEEDLE_POLICY, type_k="q8_0")
    assert np.corrcoef(softmax_votes.ravel(), query_votes.ravel())[0, 1] > 0.99
    assert _overlap(softmax_kept, query_kept) >= 0.95
