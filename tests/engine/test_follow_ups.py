"""The questions after a fast first answer (read auto, with a draft): the document is then read as
its passages (a passage bank) in the background, saved, and each later question loads the passages
it chooses from it and reads only the rest of its prompt, in this process or a later one."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document, load_document
from kvchat.engine import AskSettings, Engine
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.reading.cheap_pass import speed_kind
from kvchat.engine.reading.passage_bank import BANK, load_chosen, opening_end
from kvchat.errors import CancelledError
from kvchat.events import Done, LaterReading, Notice, Progress, Pruned
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel
from kvchat.policy import SnapKV

from tests.inspect_helpers import last_logits, returned
from tests.tiny_gguf import write_tiny_gguf

SETTINGS = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, threads=2, sources=False)
TOPICS = ["orchard apples", "harbour ferries", "governing law", "violin strings", "glacier ice", "copper mines",
          "desert owls", "paper lanterns", "river otters", "clock towers", "salt marshes", "tea gardens"]
QUESTION = [5, 9, 13, 17, 21, 25, 29, 33]  # token ids read after the passages: a question's stand-in


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory) -> Path:
    """Another tiny model (other weights) with the same vocabulary."""
    return write_tiny_gguf(tmp_path_factory.mktemp("draft") / "draft.gguf", seed=9)


@pytest.fixture
def topics(tmp_path: Path) -> Path:
    path = tmp_path / "topics.txt"
    path.write_text("\n\n".join(" ".join(f"Note {n} is on {topic}." for n in range(12)) for topic in TOPICS))
    return path


def _done(events) -> Done:
    return [event for event in events if isinstance(event, Done)][0]


def test_after_a_fast_answer_the_passages_are_read_and_saved_and_a_follow_up_loads_those_it_chooses(
    tiny_model_path: Path, draft_path: Path, topics: Path,
) -> None:
    with Engine(str(tiny_model_path), draft=str(draft_path)) as engine:
        conversation = engine.conversation(load_document(topics), SETTINGS)
        try:
            assert list(conversation.open()) == []  # nothing read before the question
            first = _done(engine.answer(conversation, "Which notes are on glacier ice?"))
            assert conversation.unread and not conversation.bank_saved
            reading = [event for event in conversation.read_on() if isinstance(event, Progress)]
            assert conversation.bank_saved and not conversation.unread and list(conversation.read_on()) == []
            conversation.reset()
            events = list(engine.answer(conversation, "Which notes are on tea gardens?"))
            passages, n_prompt, n_ctx = conversation._text.passages, len(conversation.prompt_tokens), conversation.run.n_ctx
        finally:
            conversation.close()
        fast_speed = engine.speeds.measured(speed_kind(SETTINGS))
        later = _done(engine.ask(load_document(topics), "Which notes are on tea gardens?", SETTINGS))  # as the next process
        assert engine.speeds.measured(speed_kind(SETTINGS)) == fast_speed  # a fresh reading's speed, for `kvchat inspect`
        saved = engine.states.has(conversation.document_tokens, BANK)
    assert first.read_later is LaterReading.PASSAGES and first.stats.read.startswith("bm25")
    assert reading[-1].done == reading[-1].total == passages.ends[-1] and saved
    (pruned,) = [event for event in events if isinstance(event, Pruned)]
    kept = np.asarray(pruned.kept_positions)
    window_start = n_prompt - SETTINGS.method.window
    loaded = kept[kept < passages.ends[-1]]  # the opening, the chosen passages and their marks
    done = _done(events)
    assert done.stats.read.endswith(f", {len(loaded):,} loaded") and done.stats.loaded_tokens == len(loaded) and done.read_later is None
    second_pass = [event for event in events if isinstance(event, Progress)][-1]
    assert second_pass.total == len(kept) - len(loaded) - SETTINGS.method.window  # the closing template, before the window
    assert int(kept[-1]) == n_prompt - 1 and window_start > passages.ends[-1]
    assert later.stats.read == done.stats.read and later.answer == done.answer and later.read_later is None
    assert n_ctx == 1280 < passages.n_tokens  # the budget, the conversation's room and the answer's: not the document's


def test_a_passages_reading_stopped_part_way_goes_on_from_where_it_stopped(tiny_model_path: Path, draft_path: Path,
                                                                            topics: Path) -> None:
    stop = threading.Event()
    with Engine(str(tiny_model_path), draft=str(draft_path)) as engine:
        conversation = engine.conversation(load_document(topics), SETTINGS)
        try:
            list(conversation.open())
            _done(engine.answer(conversation, "Which notes are on glacier ice?"))
            stopped: list[Progress] = []
            with pytest.raises(CancelledError):
                for event in conversation.read_on(stop):
                    if isinstance(event, Progress):
                        stopped.append(event)
                        if len(stopped) == 8:
                            stop.set()
            went_on = [event for event in conversation.read_on() if isinstance(event, Progress)]
        finally:
            conversation.close()
        again = engine.conversation(load_document(topics), SETTINGS)
        try:
            list(again.read_bank())
        finally:
            again.close()
        tokens, passages = conversation.document_tokens, conversation._text.passages
        logits = []
        for bank in (conversation.bank, again.bank):  # each passage read after the stop, and one before, with the question
            cache = KvCache(LlamaContext(engine.model, ContextSettings(n_ctx=4096, n_batch=256, threads=2)))
            with cache.ctx:
                load_chosen(cache, bank, passages, np.arange(len(passages.starts)), tokens)
                cache.decode(QUESTION, want_logits=True)
                logits.append(last_logits(cache.ctx))
    total = passages.ends[-1]
    assert 0 < stopped[-1].done < total and went_on[-1].done == total
    assert min(event.done for event in went_on) >= stopped[-2].done  # nothing read before the stop counted again
    assert len(conversation.bank.passages) == len(again.bank.passages) == len(passages.starts)
    # As a reading that was never stopped, within float noise as the bank's blocks round it (packed as
    # held, a value at the edge of a q4_0 step may land on the next one: 2e-3 here).
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-2)


def test_the_engine_reads_a_documents_passages_for_later_and_a_new_question_loads_them(
    tiny_model_path: Path, draft_path: Path, topics: Path,
) -> None:
    fits = load_document(topics)  # 3,966 tokens of text; its prompt too within the model's 4,096 positions
    past = Document(Path("twice.txt"), "text", f"{fits.text}\n\n{fits.text}")
    with Engine(str(tiny_model_path), draft=str(draft_path)) as engine:
        assert engine.later_reading(fits, SETTINGS) is LaterReading.PASSAGES
        assert engine.later_reading(fits, AskSettings(read="fast")) is LaterReading.WHOLE
        assert engine.later_reading(past, AskSettings(read="fast")) is LaterReading.PASSAGES  # past the context: no whole reading
        assert engine.later_reading(fits, AskSettings(read="retrieval")) is None
        how = returned(engine.read_later(load_document(topics), SETTINGS, LaterReading.PASSAGES))
        again = list(engine.read_later(load_document(topics), SETTINGS, LaterReading.PASSAGES))
        done = _done(engine.ask(load_document(topics), "Which notes are on copper mines?", SETTINGS))
    assert how.value == "read" and again == []  # saved: not read twice
    assert done.stats.read.endswith(f", {done.stats.loaded_tokens:,} loaded") and done.read_later is None
    assert done.stats.kept_tokens - done.stats.loaded_tokens < done.stats.loaded_tokens / 2  # most of what it holds: loaded, not read
    with Engine(str(tiny_model_path)) as engine:  # no draft: every question reads in full, and the document whole after
        assert engine.later_reading(fits, SETTINGS) is LaterReading.WHOLE


def test_what_an_upload_is_read_as_later_is_decided_by_its_prompts_tokens_not_its_texts(
    tiny_model_path: Path, draft_path: Path, topics: Path,
) -> None:
    with Engine(str(tiny_model_path), draft=str(draft_path)) as engine:
        text = load_document(topics).text
        while engine.model.count_tokens(text) < engine.model.shape.n_ctx_train - 8:
            text += " ice"
        document = Document(Path("edge.txt"), "text", text)  # its text fits the 4,096 positions; its prompt does not
        conversation = engine.conversation(document, AskSettings(read="fast"))
        try:
            assert engine.model.count_tokens(text) <= engine.model.shape.n_ctx_train < len(conversation.document_tokens)
            assert engine.later_reading(document, AskSettings(read="fast")) is conversation.reading.later is LaterReading.PASSAGES
        finally:
            conversation.close()


@pytest.fixture(scope="module")
def short_models(tmp_path_factory) -> tuple[Path, Path]:
    """A model and its draft trained on 1,024 positions: the topics are four times as long."""
    folder = tmp_path_factory.mktemp("short")
    return write_tiny_gguf(folder / "model.gguf", context_length=1024), write_tiny_gguf(folder / "draft.gguf", seed=9,
                                                                                         context_length=1024)


def test_a_document_longer_than_the_context_is_answered_fast_and_its_follow_ups_load_its_passages(
    short_models: tuple[Path, Path], topics: Path,
) -> None:
    model, draft = short_models
    with Engine(str(model), draft=str(draft)) as engine:
        conversation = engine.conversation(load_document(topics), SETTINGS)
        try:
            notices = [event.text for event in conversation.open() if isinstance(event, Notice)]
            n_document = len(conversation.document_tokens)
            unmatched = list(engine.answer(conversation, "Zyxwv qwerty?"))  # no word of it in the document: the draft chooses
            conversation.reset()
            matched = _done(engine.answer(conversation, "Which notes are on glacier ice?"))
            list(conversation.read_on())
            conversation.reset()
            events = list(engine.answer(conversation, "Which notes are on tea gardens?"))
            passages = conversation._text.passages
        finally:
            conversation.close()
        assert engine.later_reading(load_document(topics), AskSettings(read="fast")) is LaterReading.PASSAGES
        plan = engine.plan(load_document(topics), SETTINGS)  # what `kvchat inspect` says
        assert (plan.fits_context, plan.method, plan.reads_fast, plan.later_reading, plan.est_read_s) == (
            False, "snapkv", True, "passages", None)
    with Engine(str(model)) as engine:  # no draft: read streamed, as before
        streamed = engine.conversation(load_document(topics), SETTINGS)
        assert streamed.settings.method.name == "snapstream" and streamed.reading.later is LaterReading.WHOLE
        streamed.close()
    assert n_document > 3 * 1024 and notices == [
        f"the document is {n_document:,} tokens, more than the 1,024 the model was trained on: each question reads the passages it chooses"]
    draft_pass = [event for event in unmatched if isinstance(event, Progress)]
    chosen = _done(unmatched)
    cheap = draft_pass[1:draft_pass.index(max(draft_pass, key=lambda event: event.done)) + 1]
    assert [event.done for event in cheap] == sorted(event.done for event in cheap)  # the groups told as one reading
    opening = opening_end(passages)
    assert cheap[-1].total == cheap[-1].done >= n_document + 3 * opening  # every passage, in four groups at least, each after the opening
    assert chosen.stats.read.startswith("draft") and chosen.read_later is LaterReading.PASSAGES
    assert matched.stats.read.startswith("bm25") and matched.read_later is LaterReading.PASSAGES
    (pruned,) = [event for event in events if isinstance(event, Pruned)]
    kept = np.asarray(pruned.kept_positions)
    loaded = kept[kept < passages.ends[-1]]
    done = _done(events)
    assert done.stats.loaded_tokens == len(loaded) > 0 and done.read_later is None
    second_pass = [event for event in events if isinstance(event, Progress)][-1]
    assert second_pass.total == len(kept) - len(loaded) - SETTINGS.method.window  # only the question's part is read
    assert len(kept) < 1024  # all of it within the trained positions


def test_an_engine_prepares_a_document_once_for_the_conversations_about_it(
    tiny_model_path: Path, topics: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its tokens, passages and token ranges (text/document_text.PreparedDocuments): a kept model
    and the server answer one document again and again; another system prompt is another prompt."""
    document = load_document(topics)
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        first = engine.conversation(document, SETTINGS)
        passages = first.passages
        tokenized: list[str] = []
        tokenize = LlamaModel.tokenize
        monkeypatch.setattr(LlamaModel, "tokenize", lambda model, text, special=False: tokenized.append(text) or tokenize(model, text, special))
        again = engine.conversation(document, SETTINGS)
        assert tokenized == [] and again.document_tokens is first.document_tokens and again.passages is passages
        assert engine.later_reading(document, SETTINGS) is LaterReading.WHOLE and tokenized == []
        other = engine.conversation(document, AskSettings(system="Answer in French.", threads=2))
        assert tokenized and other.document_tokens != first.document_tokens
        for conversation in (first, again, other):
            conversation.close()
