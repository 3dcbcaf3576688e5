"""Streamed reading and the decode ring on the tiny model: invariants after many evictions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document
from kvchat.engine import AskSettings, Conversation, StreamSettings
from kvchat.engine.prompt import chat_tokens
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.answering import route
from kvchat.events import Done, Evicted, Token
from kvchat.llama import LlamaModel
from kvchat.policy import SnapKV, SnapStream, StreamingLLM

from tests.inspect_helpers import seq_pos_range
from tests.tiny_gguf import write_tiny_gguf

TRAINED_CONTEXT = 1024
BUDGET, CHUNK = 192, 128


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("short") / "short.gguf", seed=3, context_length=TRAINED_CONTEXT)
    with LlamaModel(path) as model:
        yield model


def long_tokens(model: LlamaModel, n: int) -> list[int]:
    text = " ".join(f"Line {i}: the code for box {i} is {1000 + i * 7}." for i in range(n // 20))
    return model.tokenize(text)


@pytest.mark.parametrize("query_aware", [True, False])
def test_ring_invariants_after_many_evictions(short_model, query_aware: bool) -> None:
    tokens = long_tokens(short_model, 6 * TRAINED_CONTEXT)
    assert len(tokens) > 5 * TRAINED_CONTEXT
    settings = AskSettings(method=SnapKV(budget=BUDGET, window=16), max_tokens=16, threads=2,
                           stream=StreamSettings(chunk=CHUNK, recent=32, query_aware=query_aware))
    question = chat_tokens(short_model, [{"role": "user", "content": "What is the code for box 7?"}])[-16:]
    evictions = 0
    with PromptRun(short_model, 768, settings, "tiny") as run:
        cache = run.cache
        for event in run.stream(tokens, question if query_aware else None, settings):
            assert cache.cells <= BUDGET + CHUNK
            if isinstance(event, Evicted):
                evictions += 1
                assert cache.cells == BUDGET
                assert list(cache.tokens[:4]) == tokens[:4]  # the sinks
                assert np.all(np.diff(cache.positions) > 0)
                assert cache.positions[-1] < TRAINED_CONTEXT
                assert list(cache.tokens[-32:]) == tokens[run.read_upto - 32 : run.read_upto]  # the ring
                assert seq_pos_range(cache.ctx) == (cache.positions[0], cache.positions[-1])
                cache.verify()
        assert run.read_upto == len(tokens)
        assert cache.peak_cells <= BUDGET + CHUNK + (16 if query_aware else 0)
    assert evictions >= len(tokens) // CHUNK - 3


@pytest.mark.system
@pytest.mark.parametrize("heads", ["sum", "per-head"])
def test_long_generation_runs_past_the_cache(short_model, heads: str, monkeypatch) -> None:
    """Per head, the reading evicts for all heads at once (chunked.py says why), the question's
    selection is per head, and the ring repacks those cells past the trained context."""
    monkeypatch.setattr(short_model, "is_end_of_generation", lambda token: False)  # the answer runs to max_tokens
    document = Document(path=Path("boxes.txt"), kind="text", text=" ".join(f"Box {i} holds {i * 3}." for i in range(40)))
    settings = AskSettings(method=SnapStream(budget=96, window=16, heads=heads), max_tokens=1500, threads=2,
                           stream=StreamSettings(chunk=64, recent=16))
    conversation = Conversation(short_model, "tiny", document, settings)
    try:
        list(conversation.open(question="What does box 3 hold?"))
        n_ctx = conversation.run.n_ctx
        assert n_ctx < 1500
        events = list(route.answer(conversation, "What does box 3 hold?"))
        done = events[-1]
        assert isinstance(done, Done) and done.stats.generated_tokens == 1500
        assert sum(isinstance(e, Evicted) for e in events) >= 2
        assert conversation.run.cache.cells <= n_ctx
        assert conversation.run.cache.positions[-1] < TRAINED_CONTEXT  # repacked past the trained context
        assert done.stats.peak_cells <= n_ctx
        assert "".join(e.text for e in events if isinstance(e, Token)) == done.answer
        assert (conversation.run.cache.head_origins is not None) == (heads == "per-head")
    finally:
        conversation.close()


def test_snapkv_answer_longer_than_its_context(tiny_model, monkeypatch) -> None:
    monkeypatch.setattr(tiny_model, "is_end_of_generation", lambda token: False)  # the answer runs to max_tokens
    document = Document(path=Path("boxes.txt"), kind="text", text=" ".join(f"Box {i} holds {i * 3}." for i in range(50)))
    settings = AskSettings(method=SnapKV(budget=128, window=16), max_tokens=900, threads=2, n_ctx=1536)
    conversation = Conversation(tiny_model, "tiny", document, settings)
    try:
        list(conversation.open())
        events = list(route.answer(conversation, "What does box 3 hold?"))
        assert events[-1].stats.generated_tokens == 900
    finally:
        conversation.close()


def test_refuses_to_read_past_the_context_without_shift(short_model, monkeypatch) -> None:
    from kvchat.errors import SettingsError

    tokens = long_tokens(short_model, 3 * TRAINED_CONTEXT)
    settings = AskSettings(method=SnapKV(budget=BUDGET, window=16), max_tokens=16, threads=2)
    with PromptRun(short_model, 768, settings, "tiny") as run:
        monkeypatch.setattr(run.cache.ctx, "can_shift", lambda: False)
        with pytest.raises(SettingsError, match="cannot shift"):
            list(run.stream(tokens, None, replace(settings, method=SnapStream(budget=BUDGET, window=16), stream=StreamSettings(chunk=CHUNK))))


def test_streamingllm_keeps_sinks_and_the_newest_tokens(short_model) -> None:
    tokens = long_tokens(short_model, 3 * TRAINED_CONTEXT)
    settings = AskSettings(method=StreamingLLM(budget=BUDGET, window=16), max_tokens=8, threads=2, stream=StreamSettings(chunk=CHUNK))
    with PromptRun(short_model, 768, settings, "tiny") as run:
        for event in run.stream(tokens, None, settings):
            if isinstance(event, Evicted):
                newest = tokens[run.read_upto - (BUDGET - 4) : run.read_upto]
                assert list(run.cache.tokens) == tokens[:4] + newest
        assert run.cache.cells == BUDGET
