"""A fast reading: the first layers read the whole prompt and choose, the whole model reads the chosen."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvchat.documents import Document, load_document
from kvchat.engine import AskSettings, Conversation, Engine, drafts
from kvchat.engine.answering import route
from kvchat.engine.drafts import Draft
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.reading.cheap_pass import CheapPass, last_read_layer
from kvchat.engine.reading.fast_reading import fast_select
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.engine.settings import FastSettings
from kvchat.errors import CancelledError, SettingsError
from kvchat.events import Done, Notice, Progress, Pruned
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel
from kvchat.models.registry import DEFAULT_CHEAP_DEPTH
from kvchat.policy import HeadReduction, SnapKV, method_named
from kvchat.policy.spans import CHUNK_TOKENS
from kvchat.tui.app import KvchatApp
from kvchat.tui.messages import EngineEvent, JobEnded
from kvchat.tui.sessions import EngineSessionFactory
from kvchat.tui.widgets import KvPanel

from tests.conftest import OTHER_BATCHES_TOLERANCE
from tests.inspect_helpers import last_logits
from tests.cli.test_cli import run_kvchat
from tests.tui.test_tui import ask, next_handled
from tests.tiny_gguf import write_tiny_gguf

WINDOW = 16


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    """A text of two facts said 40 times (about 2,500 tokens)."""
    path = tmp_path / "notes.txt"
    path.write_text("The boat was named the Grey Heron. The radio failed on day four. " * 40)
    return path


def _tokens(n: int = 600) -> list[int]:
    rng = np.random.default_rng(3)
    return [int(t) for t in rng.integers(3, 250, size=n)]


def _cache(model, flash_attn: bool = False) -> KvCache:
    return KvCache(LlamaContext(model, ContextSettings(n_ctx=2048, n_batch=256, threads=2, flash_attn=flash_attn)))


def _run(cache: KvCache, tokens: list[int], settings: AskSettings):
    return _run_with(cache, tokens, settings)


def _run_with(cache: KvCache, tokens: list[int], settings: AskSettings, cheap_pass: CheapPass = CheapPass()):
    events = fast_select(cache, tokens, settings, cheap_pass=cheap_pass)
    seen = []
    while True:
        try:
            seen.append(next(events))
        except StopIteration as finished:
            return seen, finished.value


@pytest.mark.parametrize("flash_attn", [False, True])
def test_the_cheap_pass_sees_the_first_layers_as_a_whole_pass_does(tiny_model, flash_attn: bool) -> None:
    tokens = _tokens()
    votes = []
    for cut in (None, 0):
        cache = _cache(tiny_model, flash_attn)
        with cache.ctx:
            cache.ctx.cut_after_layer(cut)
            cache.decode(tokens[:-WINDOW])
            votes.append(cache.observe(tokens[-WINDOW:]))
    whole, cheap = votes
    assert whole.shape[0] == 2 and cheap.shape[0] == 1
    np.testing.assert_allclose(cheap[0], whole[0], rtol=1e-5, atol=1e-6)


def test_only_the_chosen_tokens_stay_read_by_the_whole_model(tiny_model) -> None:
    tokens = _tokens()
    settings = AskSettings(method=SnapKV(budget=96, window=WINDOW), read="fast")
    cache = _cache(tiny_model)
    with cache.ctx:
        events, selected = _run(cache, tokens, settings)
        pruned = [e for e in events if isinstance(e, Pruned)]
        progress = [(e.done, e.total) for e in events if isinstance(e, Progress)]
        body = 96 - WINDOW  # the chosen tokens before the question's window: the model reads them in one batch
        assert progress[-2:] == [(len(tokens) - WINDOW, len(tokens)), (body, body)]
        assert len(pruned) == 1 and pruned[0].kept_tokens == 96 == cache.cells == selected.kept
        kept = np.asarray(pruned[0].kept_positions)
        assert np.array_equal(cache.origins, kept) and np.array_equal(cache.positions, np.arange(96))
        assert np.array_equal(cache.tokens, np.asarray(tokens)[kept]) and kept[-1] == len(tokens) - 1
        cache.verify()  # llama.cpp holds exactly these 96 cells: none of the cheap pass is left
        assert selected.read == f"fast {last_read_layer(2, 0.5) + 1}/2 layers" == "fast 1/2 layers"


def test_scored_by_every_layer_of_a_whole_pass_a_fast_reading_keeps_what_snapkv_keeps(tiny_model) -> None:
    """FastSettings.layers sums the cheap pass's last layers; through all of them, at full depth, choosing
    as SnapKV keeps (words, summed heads), it is SnapKV's own choice from the same window. With one
    layer (the default) it is not here."""
    tokens, method = _tokens(), SnapKV(budget=96, window=WINDOW)
    cache = _cache(tiny_model)
    with cache.ctx:
        cache.decode(tokens[:-WINDOW])
        snapkv_kept = cache.plan(method, WINDOW, cache.observe(tokens[-WINDOW:])).kept
        cache.clear()
        chosen = {}
        for layers in (1, 2, 9):
            settings = AskSettings(method=method, read="fast", fast=FastSettings(depth=1.0, layers=layers, spans="words", heads="sum"))
            _, selected = _run(cache, tokens, settings)
            chosen[layers] = cache.origins.copy()
            assert selected.read == "fast 2/2 layers"
            cache.clear()
    assert np.array_equal(chosen[2], snapkv_kept) and np.array_equal(chosen[9], snapkv_kept)
    assert not np.array_equal(chosen[1], snapkv_kept)


def test_kept_at_their_own_positions_every_token_gives_a_plain_readings_logits(tiny_model) -> None:
    tokens = _tokens(400)
    plain = _cache(tiny_model)
    with plain.ctx:
        plain.decode(tokens, want_logits=True)
        expected = last_logits(plain.ctx)
    for positions in ("consecutive", "original"):
        cache = _cache(tiny_model)
        with cache.ctx:
            settings = AskSettings(method=SnapKV(budget=1000, window=WINDOW), read="fast", fast=FastSettings(positions=positions))
            _run(cache, tokens, settings)
            assert np.array_equal(cache.positions, np.arange(len(tokens)))
            np.testing.assert_allclose(last_logits(cache.ctx), expected, rtol=OTHER_BATCHES_TOLERANCE, atol=OTHER_BATCHES_TOLERANCE)


def test_original_positions_move_the_chosen_tokens_back(tiny_model) -> None:
    tokens = _tokens()
    cache = _cache(tiny_model)
    with cache.ctx:
        _, selected = _run(cache, tokens, AskSettings(method=SnapKV(budget=96, window=WINDOW), read="fast", fast=FastSettings(positions="original")))
        assert np.array_equal(cache.positions, cache.origins) and cache.next_pos == len(tokens)
        cache.verify()
        cache.decode([5], want_logits=True)  # the answer goes on after the prompt's last position
        assert cache.positions[-1] == len(tokens)


def test_re_reading_every_token_then_keeping_the_budget_is_snapkv_on_a_full_reading(tiny_model) -> None:
    """FastSettings.reread above the budget: the whole model reads what the cheap pass chose, and the
    question's attention over that reading keeps the budget's. Re-reading every token is a full
    reading, so it keeps what SnapKV keeps, with the same logits."""
    tokens, method = _tokens(), SnapKV(budget=96, window=WINDOW)
    plain = _cache(tiny_model)
    with plain.ctx:
        plain.decode(tokens[:-WINDOW])
        plain.apply(plain.plan(method, WINDOW, plain.observe(tokens[-WINDOW:])))
        expected_kept, expected_positions, expected_logits = plain.origins.copy(), plain.positions.copy(), last_logits(plain.ctx)
    cache = _cache(tiny_model)
    with cache.ctx:
        events, selected = _run(cache, tokens, AskSettings(method=method, read="fast", fast=FastSettings(reread=len(tokens))))
        pruned = [e for e in events if isinstance(e, Pruned)]
        assert len(pruned) == 1 and pruned[0].kept_positions == tuple(int(p) for p in expected_kept)
        assert np.array_equal(cache.origins, expected_kept) and np.array_equal(cache.positions, expected_positions)
        assert cache.cells == 96 == selected.kept and selected.read == "fast 1/2 layers, 600 re-read"
        np.testing.assert_allclose(last_logits(cache.ctx), expected_logits, rtol=1e-5, atol=1e-5)
        cache.verify()


def test_a_larger_re_reading_keeps_the_budget_at_the_chosen_tokens_own_positions(tiny_model) -> None:
    tokens = _tokens()
    cache = _cache(tiny_model)
    with cache.ctx:
        settings = AskSettings(method=SnapKV(budget=96, window=WINDOW), read="fast", fast=FastSettings(reread=300, positions="original"))
        _, selected = _run(cache, tokens, settings)
        assert cache.cells == 96 and selected.read == "fast 1/2 layers, 300 re-read"
        assert np.array_equal(cache.positions, cache.origins) and cache.origins[-WINDOW:].tolist() == list(range(600 - WINDOW, 600))
        assert cache.next_pos == len(tokens)
        cache.verify()
    with pytest.raises(SettingsError, match="re-reads at least the budget"):
        AskSettings(method=SnapKV(budget=96, window=WINDOW), read="fast", fast=FastSettings(reread=95))


def test_chunk_spans_re_read_whole_passages(tiny_model) -> None:
    """The cheap pass may choose runs of CHUNK_TOKENS tokens to read again (Speculative Prefill's
    chunk selection), so its best-voted token comes back with its chunk; by default it chooses
    whole sentences, each by its strongest head."""
    tokens, budget = _tokens(), 4 + WINDOW + 2 * CHUNK_TOKENS
    assert (FastSettings().spans, FastSettings().heads) == ("sentences", "max")
    cache = _cache(tiny_model)
    with cache.ctx:
        settings = AskSettings(method=SnapKV(budget=budget, window=WINDOW), read="fast", fast=FastSettings(spans="chunks"))
        _, selected = _run(cache, tokens, settings)
        chosen = set(cache.origins.tolist())
        assert cache.cells == budget == selected.kept
    whole = [c for c in range(len(tokens) // CHUNK_TOKENS) if set(range(c * CHUNK_TOKENS, (c + 1) * CHUNK_TOKENS)) <= chosen]
    assert whole  # at least the winner's chunk, all 32 tokens
    with pytest.raises(SettingsError, match="unknown fast reading spans"):
        AskSettings(read="fast", fast=FastSettings(spans="paragraphs"))


def test_the_cheap_pass_may_reduce_its_heads_otherwise_than_the_method_keeps(tiny_model) -> None:
    """FastSettings.heads="max" (the default): the re-read tokens are those the cheap pass's strongest head
    votes for; "sum" chooses as the method keeps."""
    tokens, method = _tokens(), SnapKV(budget=64, window=WINDOW, spans="none")
    chosen = {}
    for heads in ("sum", "max"):
        cache = _cache(tiny_model)
        with cache.ctx:
            _, selected = _run(cache, tokens, AskSettings(method=method, read="fast", fast=FastSettings(spans="none", heads=heads)))
            chosen[heads] = cache.origins.tolist()
            assert cache.cells == 64 == selected.kept
    assert chosen["sum"] != chosen["max"]
    with pytest.raises(SettingsError, match="unknown fast reading heads"):
        AskSettings(read="fast", fast=FastSettings(heads="per-head"))


def test_a_fast_reading_stops_between_batches_of_the_model_reading_the_chosen_tokens(tiny_model) -> None:
    tokens, stop = _tokens(), threading.Event()
    cache = _cache(tiny_model)
    with cache.ctx:
        settings = AskSettings(method=SnapKV(budget=96, window=WINDOW), read="fast", fast=FastSettings(reread=400))
        with pytest.raises(CancelledError):
            for event in fast_select(cache, tokens, settings, stop):
                if isinstance(event, Progress) and event.total == 400 - WINDOW:
                    stop.set()  # after the first batch of the re-reading
        assert cache.cells == 256  # one batch of n_batch read, the second never begun


def test_a_follow_up_before_the_whole_reading_reads_fast_with_its_earlier_turns_kept(tiny_model_path: Path, notes: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, read="fast", threads=2,
                           fast=FastSettings(reread=400))  # more than the budget: the question's attention keeps 64
    with Engine(str(tiny_model_path)) as engine:
        conversation = engine.conversation(load_document(notes), settings)
        n_document = len(conversation.document_tokens)
        try:
            assert list(conversation.open()) == []  # nothing read before the question
            first = [e for e in engine.answer(conversation, "What was the boat called?") if isinstance(e, Done)][0]
            second = [e for e in engine.answer(conversation, "What failed?") if isinstance(e, Done)][0]
            origins = conversation.run.cache.origins.tolist()
            held = set(origins)
            n_second = len(conversation.prompt_tokens)
            read_whole = list(conversation.read_on())
            third = [e for e in engine.answer(conversation, "On which day?") if isinstance(e, Done)][0]
        finally:
            conversation.close()
        again = [e for e in engine.ask(load_document(notes), "Boat?", settings) if isinstance(e, Done)][0]
    assert first.stats.read.startswith("fast 1/2 layers, ") and second.stats.read.startswith("fast 1/2 layers, ")
    assert second.stats.prompt_tokens == n_second > first.stats.prompt_tokens  # the first turn is in the follow-up's prompt
    n_turn = second.stats.kept_tokens - first.stats.kept_tokens  # kept beside the budget's, as from a whole reading
    assert n_turn > 20 and set(range(n_document, n_document + n_turn)) <= held  # the tokens right after the document's
    assert len(origins) == len(held)  # each read once
    assert first.read_later and second.read_later and read_whole[-1].done == n_document
    assert third.stats.read == "full" and third.stats.loaded_tokens == 0 and not third.read_later
    assert again.stats.read == "full" and again.stats.loaded_tokens > 1500  # the saved reading, not a fast one


def test_with_retrieval_a_follow_up_reads_its_own_passages_and_nothing_is_read_whole(tiny_model_path: Path, notes: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, read="retrieval", threads=2)
    with Engine(str(tiny_model_path)) as engine:
        saved = [e for e in engine.ask(load_document(notes), "Boat?", replace(settings, read="full")) if isinstance(e, Done)][0]
        conversation = engine.conversation(load_document(notes), settings)
        n_document = len(conversation.document_tokens)
        try:
            opened = list(conversation.open())
            first, second = ([e for e in engine.answer(conversation, question) if isinstance(e, Done)][0]
                             for question in ("What was the boat called?", "What failed?"))
            unread, read_on = conversation.unread, list(conversation.read_on())
        finally:
            conversation.close()
        never_awaits = engine.plan(load_document(notes), settings).reads_fast_before_the_rest(n_document - 1)
    assert saved.stats.read == "full" and opened == []  # a saved reading is there, and left unloaded
    assert first.stats.read.startswith("bm25, ") and second.stats.read.startswith("bm25, ")
    assert first.stats.loaded_tokens == second.stats.loaded_tokens == 0 and second.stats.prompt_tokens > first.stats.prompt_tokens
    assert second.stats.kept_tokens > first.stats.kept_tokens  # the first turn is read whole beside the follow-up's passages
    assert not first.read_later and not second.read_later and not unread and read_on == []  # nothing to read on
    assert never_awaits  # a whole reading under way, all but done, is not awaited: it would not be loaded


@pytest.mark.parametrize(("read_before", "whole_speed", "read"), [
    (0, 1000, "fast 1/2 layers"), (256, 1000, "fast 1/2 layers"), (2048, 1000, "full"),
    (0, 10**6, "fast 1/2 layers"),  # none begun here: nothing to await (the server's own reading decided before)
])
def test_a_follow_up_awaits_the_rest_of_the_whole_reading_where_that_is_sooner(
    tiny_model_path: Path, tmp_path: Path, notes: Path, read_before: int, whole_speed: int, read: str,
) -> None:
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, read="fast", threads=2, n_batch=256)
    with Engine(str(tiny_model_path)) as engine:
        conversation = engine.conversation(load_document(notes), settings)
        conversation.speeds = ReadingSpeeds(tmp_path / "speeds.json", "tiny")
        n_document, stop = len(conversation.document_tokens), threading.Event()
        try:
            list(conversation.open())
            [e for e in engine.answer(conversation, "What was the boat called?") if isinstance(e, Done)]
            conversation.speeds.record("read", whole_speed, 1.0)  # as measured here: a whole reading 1,000 tokens/s,
            conversation.speeds.record("fast", 2000, 1.0)  # a fast one 2,000 (the prompt's ~2,600 in 1.3 s)
            if read_before:
                with pytest.raises(CancelledError):
                    for event in conversation.read_on(stop):
                        if event.done >= read_before:
                            stop.set()  # the chat's background reading, stopped for the follow-up
            events = list(engine.answer(conversation, "What failed?"))
        finally:
            conversation.close()
    follow_up = [e for e in events if isinstance(e, Done)][0]
    assert 2048 < n_document < 2048 + 1300  # the rest after 2,048 read comes in less than 1.3 s, after 256 in more
    assert follow_up.stats.read == read
    waited = [e.text for e in events if isinstance(e, Notice)] == [
        "read in full: the rest of the document's whole reading comes sooner than a fast reading"]
    assert waited == (read == "full")
    if read == "full":
        assert [e.done for e in events if isinstance(e, Progress)][0] == read_before  # went on from there


def test_a_fast_reading_stopped_midway_leaves_the_whole_reading_set_aside(tiny_model_path: Path, notes: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, read="fast", threads=2, n_batch=256)
    with Engine(str(tiny_model_path)) as engine:
        conversation = engine.conversation(load_document(notes), settings)
        n_document, background, question = len(conversation.document_tokens), threading.Event(), threading.Event()
        try:
            list(conversation.open())
            [e for e in engine.answer(conversation, "What was the boat called?") if isinstance(e, Done)]
            with pytest.raises(CancelledError):
                for event in conversation.read_on(background):
                    if event.done >= 512:
                        background.set()
            with pytest.raises(CancelledError):
                for event in engine.answer(conversation, "What failed?", cancel=question):
                    if isinstance(event, Progress) and event.done:
                        question.set()  # Esc, after the follow-up's fast reading read a batch
            went_on = [e.done for e in conversation.read_on() if isinstance(e, Progress)]
        finally:
            conversation.close()
        again = [e for e in engine.ask(load_document(notes), "Boat?", settings) if isinstance(e, Done)][0]
    assert went_on[0] == 512 and went_on[-1] == n_document  # from where it had stopped, nothing of the fast reading kept
    assert again.stats.loaded_tokens == n_document


def test_a_prompt_the_re_reading_would_mostly_cover_is_read_in_full(tiny_model_path: Path, notes: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, read="fast", threads=2, fast=FastSettings(reread=2000))
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        conversation = engine.conversation(load_document(notes), settings)
        try:
            list(conversation.open())
            events = list(engine.answer(conversation, "What was the boat called?"))
        finally:
            conversation.close()
    n_prompt = len(conversation.prompt_tokens)
    assert 2000 < n_prompt < 1.5 * 2000  # two thirds of it or more would be re-read
    notices = [e.text for e in events if isinstance(e, Notice)]
    assert notices == [f"read in full: a fast reading would re-read 2,000 of this prompt's {n_prompt:,} tokens"]
    done = [e for e in events if isinstance(e, Done)][0]
    assert done.stats.read == "full" and done.stats.prompt_tokens == n_prompt and done.stats.kept_tokens == 64


def test_after_a_fast_answer_the_whole_reading_goes_on_from_where_it_was_stopped(tiny_model_path: Path, notes: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, read="fast", threads=2, n_batch=256)
    with Engine(str(tiny_model_path)) as engine:
        conversation = engine.conversation(load_document(notes), settings)
        n_document, stop = len(conversation.document_tokens), threading.Event()
        try:
            list(conversation.open())
            first = [e for e in engine.answer(conversation, "What was the boat called?") if isinstance(e, Done)][0]
            assert first.stats.read == "fast 1/2 layers" and conversation.unread
            stopped: list[tuple[int, int]] = []
            with pytest.raises(CancelledError):
                for event in conversation.read_on(stop):
                    stopped.append((event.done, event.total))
                    if event.done:
                        stop.set()  # after the first batch
            assert stopped == [(0, n_document), (256, n_document)] and conversation.unread
            went_on = [(e.done, e.total) for e in conversation.read_on() if isinstance(e, Progress)]
            assert went_on[0] == (256, n_document) and went_on[-1] == (n_document, n_document) and not conversation.unread
            assert [done for done, _ in went_on] == [256, *range(512, n_document, 256), n_document]
            follow_up = list(engine.answer(conversation, "What failed?"))
        finally:
            conversation.close()
        again = [e for e in engine.ask(load_document(notes), "Boat?", replace(settings, read="full")) if isinstance(e, Done)][0]
    read_for_follow_up = [e for e in follow_up if isinstance(e, Progress)]
    assert read_for_follow_up[0].done >= n_document  # the question's own tokens only
    assert [e for e in follow_up if isinstance(e, Done)][0].stats.read == "full"
    assert again.stats.loaded_tokens == n_document  # the reading was saved


class ReadingOnAwaitsTheQuestion(EngineSessionFactory):
    """The first whole reading in the background reads nothing until a question stops it, as a long
    document's would: the tiny model reads these notes whole in under a second, and where that ends
    before the question comes (a loaded machine), the question is selected from it instead."""

    def open(self, *args, **kwargs):
        session = super().open(*args, **kwargs)
        read_on, first = session.read_on, threading.Event()

        def read_on_after_the_question(cancel: threading.Event, paused):
            if first.is_set():
                return read_on(cancel, paused)
            first.set()
            assert cancel.wait(60), "no question stopped the reading"
            raise CancelledError("stopped for the question")

        session.read_on = read_on_after_the_question
        return session


async def test_the_chat_answers_after_the_cheap_pass_and_follow_ups_from_the_reading_it_did_meanwhile(tiny_model_path: Path, notes: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, read="fast", threads=2)
    app = KvchatApp(ReadingOnAwaitsTheQuestion(str(tiny_model_path), use_cache=False), [notes], settings)
    async with app.run_test(size=(120, 40)) as pilot:
        read_on = next_handled(app, lambda message: isinstance(message, JobEnded) and message.job == "reading on"
                               and message.outcome == "done")  # the reading begun on opening gives way to the question
        await ask(pilot, app, "What was the boat called?", timeout_s=60)
        panel = app.query_one(KvPanel)
        assert panel.figures.read == "fast 1/2 layers" and panel.figures.cells == 64
        assert (await asyncio.wait_for(read_on, 60)).outcome == "done" and panel.figures.later_reading == "done"
        n_document = app.session.token_count
        assert panel.figures.later_reading == "done" and not app.session.unread
        progress: list[Progress] = []
        def keep_progress(message: object) -> None:
            if isinstance(message, EngineEvent) and isinstance(message.event, Progress):
                progress.append(message.event)

        app.message_signal.subscribe(app, keep_progress, immediate=True)
        await ask(pilot, app, "What failed?", timeout_s=60)
        assert panel.figures.read == "full" and progress and progress[0].done >= n_document  # the question's tokens only
    await asyncio.to_thread(app.close_engine)


async def test_with_retrieval_the_chat_reads_nothing_whole_in_the_background(tiny_model_path: Path, notes: Path) -> None:
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, read="retrieval", threads=2)
    app = KvchatApp(EngineSessionFactory(str(tiny_model_path), use_cache=False), [notes], settings)
    started: list[object] = []
    async with app.run_test(size=(120, 40)) as pilot:
        app.message_signal.subscribe(app, lambda message: started.append(message) if isinstance(message, JobEnded)
                                     and message.job == "reading on" else None, immediate=True)
        for question in ("What was the boat called?", "What failed?"):
            await ask(pilot, app, question, timeout_s=60)
            panel = app.query_one(KvPanel)
            assert panel.figures.read.startswith("bm25, ") and panel.figures.later_reading is None
            assert app.reading_on_idle.is_set() and not app.session.unread
    await asyncio.to_thread(app.close_engine)
    assert started == []  # no reading on began, so none ended


@pytest.mark.system
def test_ask_read_fast_says_so(tiny_model_path: Path, tmp_path: Path, isolated_home: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("The boat was named the Grey Heron. " * 60)
    args = ["ask", str(path), "Boat?", "--model", str(tiny_model_path), "--budget", "64", "--window", "16",
            "--max-tokens", "4", "--threads", "2", "--read", "fast", "--no-cache"]
    result = run_kvchat(*args, "--json", home=isolated_home)
    plain = run_kvchat(*args, home=isolated_home)
    assert result.returncode == plain.returncode == 0, result.stderr + plain.stderr
    assert json.loads(result.stdout)["read"] == "fast 1/2 layers"
    assert [line for line in plain.stderr.splitlines() if line.startswith("read fast 1/2 layers · prompt ")]
    refused = run_kvchat(*args, "--method", "full", home=isolated_home)
    assert refused.returncode == 2 and "a fast reading chooses tokens as snapkv does" in refused.stderr


@pytest.fixture(scope="module")
def draft_path(tmp_path_factory) -> Path:
    """Another tiny model (other weights) with the same vocabulary."""
    return write_tiny_gguf(tmp_path_factory.mktemp("draft") / "draft.gguf", seed=9)


@pytest.mark.parametrize(("depth", "read"), [(1.0, "draft draft, 2/2 layers"), (0.5, "draft draft, 1/2 layers")])
def test_a_draft_model_chooses_and_the_model_reads_only_what_it_chose(tiny_model, draft_path: Path, depth, read: str) -> None:
    tokens, method = _tokens(), SnapKV(budget=96, window=WINDOW)
    as_fast_chooses = replace(method, spans="sentences", heads=HeadReduction.MAX)
    with LlamaModel(draft_path) as draft_model, closing(Draft("draft", draft_path, tiny_model)) as draft:
        assert tiny_model.same_vocabulary(draft_model) and draft_model.shape.n_layer == 2
        alone = _cache(draft_model)
        with alone.ctx:  # the draft's own choice (by its first layer, when cut), read as a plain reading
            alone.ctx.cut_after_layer(None if depth == 1 else 0)
            alone.decode(tokens[:-WINDOW])
            chosen = alone.plan(as_fast_chooses, WINDOW, alone.observe(tokens[-WINDOW:])).kept
        cache = _cache(tiny_model)
        with cache.ctx:
            settings = AskSettings(method=method, read="fast", fast=FastSettings(depth=depth, reread=96))
            events, selected = _run_with(cache, tokens, settings, CheapPass(DEFAULT_CHEAP_DEPTH, draft))
            assert selected.read == read and [e for e in events if isinstance(e, Pruned)][0].kept_tokens == 96
            assert np.array_equal(cache.origins, chosen) and np.array_equal(cache.tokens, np.asarray(tokens)[chosen])
            cache.verify()  # only the model's 96 cells: the draft read on a context of its own
            cache.decode([5], want_logits=True)
            answered = last_logits(cache.ctx)
        plain = _cache(tiny_model)
        with plain.ctx:  # the model reading those tokens itself gives the same logits
            plain.decode([tokens[p] for p in chosen] + [5], want_logits=True)
            np.testing.assert_allclose(last_logits(plain.ctx), answered, rtol=OTHER_BATCHES_TOLERANCE, atol=OTHER_BATCHES_TOLERANCE)


def test_a_draft_reads_with_its_share_of_layers_and_the_model_keeps_the_budget_of_four_times_it(tiny_model, draft_path: Path) -> None:
    tokens, method = _tokens(), SnapKV(budget=96, window=WINDOW)
    with LlamaModel(draft_path) as draft_model, closing(Draft("draft", draft_path, tiny_model)) as draft:
        alone = _cache(draft_model)
        with alone.ctx:  # what the draft's first layer chooses at four times the budget
            alone.ctx.cut_after_layer(0)
            alone.decode(tokens[:-WINDOW])
            as_fast_chooses = replace(method, budget=4 * 96, spans="sentences", heads=HeadReduction.MAX)
            chosen = alone.plan(as_fast_chooses, WINDOW, alone.observe(tokens[-WINDOW:])).kept
        cache = _cache(tiny_model)
        with cache.ctx:
            _, selected = _run_with(cache, tokens, AskSettings(method=method, read="fast"), CheapPass(DEFAULT_CHEAP_DEPTH, draft))
            assert len(chosen) == 384 and selected.read == "draft draft, 1/2 layers, 384 re-read"
            assert cache.cells == 96 and set(cache.origins.tolist()) <= set(chosen.tolist())
            assert cache.origins[-WINDOW:].tolist() == list(range(600 - WINDOW, 600))
            cache.verify()


def test_a_draft_of_another_vocabulary_is_refused_in_one_line(tiny_model_path: Path, tmp_path: Path, monkeypatch) -> None:
    from tests import tiny_gguf

    monkeypatch.setattr(tiny_gguf, "MERGES", [*tiny_gguf.MERGES, "o n"])
    other = write_tiny_gguf(tmp_path / "other.gguf")
    with pytest.raises(SettingsError, match="has another vocabulary than the model") as refused:
        Engine(str(tiny_model_path), use_cache=False, draft=str(other))
    assert refused.value.hint.startswith("use a smaller model of the same family")


def test_a_draft_not_loaded_at_start_is_loaded_once_a_cheap_pass_needs_it(tiny_model_path: Path, draft_path: Path, tmp_path: Path,
                                                                          monkeypatch) -> None:
    """As `kvchat ask` and the chat load the model's pair by default: it waits for a question whose
    words choose nothing (stop words only), where the draft's attention chooses; one of another
    vocabulary is refused then, in one line."""
    from tests import tiny_gguf

    loads: list[Path] = []
    monkeypatch.setattr(drafts, "LlamaModel", lambda path, **kwargs: loads.append(path) or LlamaModel(path, **kwargs))
    document = Document(path=Path("notes.txt"), kind="text", text="The boat was named the Grey Heron. The radio failed. " * 40)
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, threads=2)
    with Engine(str(tiny_model_path), use_cache=False, draft=str(draft_path), draft_at_start=False) as engine:
        by_words = list(engine.ask(document, "What was the boat called?", settings))[-1]
        assert by_words.stats.read.startswith("bm25, ") and loads == []
        by_attention = list(engine.ask(document, "What is it, and why?", settings))[-1]
        assert by_attention.stats.read.startswith(f"draft {draft_path},") and loads == [draft_path]
        list(engine.ask(document, "What is it, and why?", settings))
        assert loads == [draft_path]  # loaded once
        draft = engine.cheap_pass.draft
    with pytest.raises(CancelledError, match="was closed with its engine"):  # a thread still asking: never loaded again
        draft.model()
    assert loads == [draft_path]
    monkeypatch.setattr(tiny_gguf, "MERGES", [*tiny_gguf.MERGES, "o n"])
    other = write_tiny_gguf(tmp_path / "other.gguf")
    with Engine(str(tiny_model_path), use_cache=False, draft=str(other), draft_at_start=False) as engine:
        with pytest.raises(SettingsError, match=f"the draft model {other} has another vocabulary than the model"):
            list(engine.ask(document, "What is it, and why?", settings))


@pytest.mark.system
def test_ask_with_a_draft_reads_fast_by_default_and_a_draft_needs_a_fast_reading(tiny_model_path: Path, draft_path: Path, tmp_path: Path, isolated_home: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("The boat was named the Grey Heron. " * 60)
    args = ["ask", str(path), "Boat?", "--model", str(tiny_model_path), "--budget", "64", "--window", "16",
            "--max-tokens", "4", "--threads", "2", "--no-cache", "--draft", str(draft_path)]
    result = run_kvchat(*args, "--json", home=isolated_home)  # --read auto: the question's words choose
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["read"].startswith("bm25, ")
    drafted = run_kvchat(*args, "--read", "fast", "--json", home=isolated_home)
    assert json.loads(drafted.stdout)["read"] == f"draft {draft_path}, 1/2 layers, 256 re-read"
    refused = run_kvchat(*args, "--read", "full", home=isolated_home)
    assert refused.returncode == 2 and "--draft does the cheap pass of a fast reading (hint: leave --read at auto, or use --read fast)" in refused.stderr
    own = run_kvchat(*args[:-1], "none", "--read", "fast", "--json", home=isolated_home)  # the model's own layers
    assert own.returncode == 0 and json.loads(own.stdout)["read"] == "fast 1/2 layers"


def test_by_default_with_a_draft_the_question_chooses_on_a_long_enough_prompt_and_anything_else_is_read_in_full_without_a_word(
        tiny_model_path: Path, draft_path: Path, tmp_path: Path) -> None:
    long, short = tmp_path / "long.txt", tmp_path / "short.txt"
    long.write_text("The boat was named the Grey Heron. The radio failed on day four. " * 40)
    short.write_text("The boat was named the Grey Heron. " * 4)
    settings = AskSettings(method=SnapKV(budget=64, window=16), max_tokens=4, threads=2)
    assert settings.read == "auto"

    def answer(engine: Engine, path: Path, asked: AskSettings) -> tuple[list[str], Done]:
        events = list(engine.ask(load_document(path), "What was the boat called?", asked))
        return [e.text for e in events if isinstance(e, Notice)], [e for e in events if isinstance(e, Done)][0]

    wide = replace(settings, method=SnapKV(budget=256, window=16))  # over two thirds of the short prompt
    with Engine(str(tiny_model_path), use_cache=False, draft=str(draft_path)) as engine:
        fast = answer(engine, long, settings)
        too_short = answer(engine, short, wide)
        per_head = answer(engine, long, replace(settings, method=SnapKV(budget=64, window=16, heads=HeadReduction.PER_HEAD)))
        streaming = answer(engine, long, replace(settings, method=method_named("streamingllm", budget=64)))
        asked_fast = answer(engine, short, replace(wide, read="retrieval"))
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        no_draft = answer(engine, long, settings)
    assert fast[0] == [] and fast[1].stats.read.startswith("bm25, ")
    assert fast[1].stats.kept_tokens < fast[1].stats.prompt_tokens / 2
    n_short = too_short[1].stats.prompt_tokens
    assert n_short < 1.5 * 256 and too_short[0] == [] and too_short[1].stats.read == "full" and too_short[1].stats.read_tokens == n_short
    for notices, done in (per_head, streaming, no_draft):
        assert notices == [] and done.stats.read == "full" and done.stats.read_tokens == fast[1].stats.prompt_tokens
    assert asked_fast[0] == [f"read in full: a fast reading would re-read 256 of this prompt's {n_short:,} tokens"]
    assert asked_fast[1].stats.read == "full"


def test_a_first_question_during_the_whole_reading_is_read_fast_and_the_reading_goes_on_where_it_stopped(tiny_model) -> None:
    document = Document(path=Path("notes.txt"), kind="text", text="The boat was named the Grey Heron. " * 60)
    settings = AskSettings(method=SnapKV(budget=64, window=WINDOW), max_tokens=4, read="fast", threads=2, n_batch=256)
    conversation = Conversation(tiny_model, "tiny", document, settings)
    try:
        list(conversation.open())  # the first question reads fast: nothing read yet
        cancel = threading.Event()
        with pytest.raises(CancelledError):
            for event in conversation.read_on(cancel):  # the whole reading begins, as the chat begins it on opening
                if isinstance(event, Progress) and event.done >= 512:
                    cancel.set()  # a question came: the chat stops it
        stopped_at = conversation.run.read_upto
        done = list(route.answer(conversation, "What was the boat called?"))[-1]
        assert done.stats.read == "fast 1/2 layers" and done.stats.kept_tokens <= 64  # read fast, at once
        resumed = [event.done for event in conversation.read_on() if isinstance(event, Progress)]
        assert 512 <= stopped_at < len(conversation.document_tokens)
        assert resumed[0] == stopped_at and resumed[-1] == len(conversation.document_tokens)  # not read again from 0
        follow_up = list(route.answer(conversation, "And the radio?"))[-1]
        assert follow_up.stats.read == "full"
    finally:
        conversation.close()
