"""A background reading pauses while a question is answered in any kvchat process (foreground.py)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Generator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.inspect_helpers import last_logits, returned
from kvchat.documents import Document
from kvchat.engine import AskSettings, Conversation
from kvchat import events
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.engine.kvcache import cache as cache_module
from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.kvcache.foreground import Foreground, HeldWhileBusy, batches_stop_while
from kvchat.engine.kvcache import in_progress
from kvchat.engine.kvcache.in_progress import ReadingsInProgress, WholeReadingDone, read_alone
from kvchat.errors import CancelledError
from kvchat.events import Event, Notice, Progress
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel
from kvchat.policy import SnapKV


def _give_way_in_thread(foreground: Foreground, cancel: threading.Event) -> tuple[threading.Event, list[bool]]:
    returned, waited = threading.Event(), []

    def run() -> None:
        waited.append(foreground.give_way(cancel))
        returned.set()

    threading.Thread(target=run, daemon=True).start()
    return returned, waited


def test_a_reading_goes_on_at_once_while_no_question_is_answered(tmp_path: Path) -> None:
    assert Foreground(tmp_path / "reading").give_way(threading.Event()) is False


def test_a_reading_waits_until_every_question_is_answered(tmp_path: Path) -> None:
    foreground = Foreground(tmp_path)
    with foreground.answering(), foreground.answering():  # two questions at once share the lock
        returned, waited = _give_way_in_thread(foreground, threading.Event())
        assert not returned.wait(0.5)  # paused while they are answered
    assert returned.wait(10) and waited == [True]


def test_a_paused_reading_that_is_stopped_stops_waiting(tmp_path: Path) -> None:
    foreground, cancel = Foreground(tmp_path), threading.Event()
    with foreground.answering():
        returned, waited = _give_way_in_thread(foreground, cancel)
        assert not returned.wait(0.3)
        cancel.set()
        assert returned.wait(10) and waited == [True]


def test_a_look_tells_whether_a_question_is_answered_without_waiting(tmp_path: Path) -> None:
    foreground = Foreground(tmp_path)
    assert not foreground.busy()
    with foreground.answering():
        assert foreground.busy()
    assert not foreground.busy()


def test_a_reading_given_way_waits_between_its_batches_and_returns_what_it_returned(tmp_path: Path) -> None:
    foreground, said, batches = Foreground(tmp_path), [], threading.Semaphore(0)

    def reading() -> Generator[Event, None, str]:
        yield Notice("reading notes.txt")
        for done in (512, 1024):
            said.append(f"batch {done}")
            batches.release()
            yield Progress(done, 1024, 1.0)
        return "read"

    events, returned = [], []

    def run() -> None:
        given_way = foreground.giving_way(reading(), threading.Event(), lambda waits: said.append(f"paused {waits}"))
        while True:
            try:
                events.append(next(given_way))
            except StopIteration as finished:
                returned.append(finished.value)
                return

    with foreground.answering():
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert batches.acquire(timeout=10)
        assert not batches.acquire(timeout=0.3)  # the second batch waits for the question
    thread.join(10)
    assert said == ["batch 512", "paused True", "paused False", "batch 1024"]
    assert events == [Notice("reading notes.txt"), Progress(512, 1024, 1.0), Progress(1024, 1024, 1.0)]
    assert returned == ["read"]


def test_held_while_busy_holds_the_foreground_only_while_busy(tmp_path: Path) -> None:
    foreground = Foreground(tmp_path)
    held = HeldWhileBusy(Foreground(tmp_path))
    held.hold(True)
    held.hold(True)  # once
    assert foreground.busy()
    held.hold(False)
    assert not foreground.busy()


def test_a_question_awaiting_another_processs_whole_reading_does_not_hold_that_reading_up(tmp_path: Path) -> None:
    key, saved = "0" * 40, threading.Event()
    elsewhere, here = ReadingsInProgress(tmp_path), ReadingsInProgress(tmp_path)  # two processes' views (one Foreground:
    # busy() and give_way() open the lock file anew, as another process would)
    claim = elsewhere.claim(key, "notes.txt", "model", 1024)  # another process reads the document whole
    assert claim is not None
    with here.foreground.answering():
        waiting = read_alone(here, (key, "notes.txt", "model", 1024), saved.is_set, lambda: iter(()))
        assert next(waiting) == Notice("another kvchat process is reading notes.txt; waiting for it")
        assert elsewhere.foreground.busy()  # the question holds the foreground until it awaits the reading
        ended: list[WholeReadingDone] = []
        thread = threading.Thread(target=lambda: ended.append(returned(waiting)), daemon=True)
        thread.start()
        given_up = threading.Event()
        timer = threading.Timer(10, given_up.set)
        timer.start()
        elsewhere.foreground.give_way(given_up)  # that reading goes on while the question awaits it
        timer.cancel()
        assert not given_up.is_set()
        saved.set()
        claim.release()
        thread.join(10)
        assert ended == [WholeReadingDone.SAVED] and elsewhere.foreground.busy()  # held again, for its answer
    assert not elsewhere.foreground.busy()


def _tokens_and_expected(model: LlamaModel) -> tuple[list[int], np.ndarray]:
    """600 tokens, and the logits after them and one more token read straight through."""
    tokens = model.tokenize("The boat was named the Grey Heron, and the radio failed on day four. " * 40)[:600]
    straight = KvCache(LlamaContext(model, ContextSettings(n_ctx=1024, n_batch=256, threads=2)))
    with straight.ctx:
        returned(iter(straight.prefill(tokens, 0, len(tokens))))
        straight.decode([5], want_logits=True)
        return tokens, last_logits(straight.ctx)


def test_a_batch_under_way_stops_part_way_for_a_question_and_is_read_again_after_it(tiny_model, tmp_path: Path) -> None:
    tokens, expected = _tokens_and_expected(tiny_model)
    foreground, said = Foreground(tmp_path), []
    question = foreground.answering()
    question.__enter__()  # comes while the first batch is read: it stops at once

    def paused(waits: bool) -> None:
        said.append(waits)
        if waits:
            question.__exit__(None, None, None)  # answered while the reading waits

    cache = KvCache(LlamaContext(tiny_model, ContextSettings(n_ctx=1024, n_batch=256, threads=2)))
    with cache.ctx:
        events = list(foreground.giving_way(cache.prefill(tokens, 0, len(tokens)), threading.Event(), paused))
        assert [event.done for event in events] == [0, 256, 512, 600] and said == [True, False]
        cache.decode([5], want_logits=True)
        assert np.allclose(last_logits(cache.ctx), expected, atol=1e-5, rtol=1e-5)


def test_a_reading_stopped_while_a_batch_is_under_way_stops_part_way_through_it(tiny_model) -> None:
    tokens = tiny_model.tokenize("The boat was named the Grey Heron. " * 40)[:600]
    cancel, armed, asked = threading.Event(), threading.Event(), []

    def check() -> bool:  # Esc, or `kvchat cache stop`, comes while the second batch is read
        asked.append(armed.is_set())
        if armed.is_set():
            cancel.set()
        return False

    cache = KvCache(LlamaContext(tiny_model, ContextSettings(n_ctx=1024, n_batch=256, threads=2)))
    with cache.ctx, batches_stop_while(check):
        reading = cache.prefill(tokens, 0, len(tokens), cancel)
        assert next(reading).done == 256
        armed.set()
        with pytest.raises(CancelledError):  # a batch read to its end would tell its progress first
            next(reading)
        assert asked.count(True) == 1
        assert cache.cells == 256 and np.array_equal(np.sort(cache.ctx.positions()), np.arange(256))


def test_a_readings_speed_is_that_of_its_batches_not_a_stopped_one_nor_its_consumers_hold(tiny_model, monkeypatch) -> None:
    """The speed a reading shows (the CLI's bar, the chat's figures): its batches read from where it
    began (100 tokens read before), not a batch stopped part-way for a question (1,000 s on its
    clock here) nor the 1,000 s its consumer holds each event (a pause)."""
    tokens = tiny_model.tokenize("The boat was named the Grey Heron. " * 40)[:600]
    held_s, stops = [0.0], [True]
    monkeypatch.setattr(cache_module, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + held_s[0]))

    def check() -> bool:  # the first batch stops part-way, 1,000 s into it
        if stops and stops.pop():
            held_s[0] += 1000.0
            return True
        return False

    told = []
    cache = KvCache(LlamaContext(tiny_model, ContextSettings(n_ctx=1024, n_batch=256, threads=2)))
    with cache.ctx, batches_stop_while(check):
        for progress in cache.prefill(tokens, 100, 700):
            told.append(progress)
            held_s[0] += 1000.0
    assert [(progress.done, progress.read_from) for progress in told] == [(100, 100), (356, 100), (612, 100), (700, 100)]
    assert told[0].elapsed_s == 0.0 and 0.0 < told[-1].elapsed_s < 1000.0 and held_s[0] == 5000.0
    assert told[-1].tokens_per_s == 600 / told[-1].elapsed_s


def test_a_reading_begun_in_the_background_reads_on_for_the_question_that_takes_it_over(tiny_model, tmp_path: Path) -> None:
    """As the server's reading of an upload, taken over by a request whose rest of it is sooner:
    what stops a batch is the reading thread's now, not the one it began in."""
    tokens, foreground = tiny_model.tokenize("The boat was named the Grey Heron. " * 40)[:600], Foreground(tmp_path)
    cache = KvCache(LlamaContext(tiny_model, ContextSettings(n_ctx=1024, n_batch=256, threads=2)))
    with cache.ctx:
        reading = cache.prefill(tokens, 0, len(tokens))
        with batches_stop_while(foreground.busy):
            assert next(reading).done == 256  # in the background
        with foreground.answering():  # the request that reads on holds the foreground
            assert [progress.done for progress in itertools.islice(reading, 3)] == [512, 600]


def test_a_question_that_could_not_take_the_lock_is_not_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "cache"
    blocker.write_text("")  # a file where the cache folder should be
    foreground = Foreground(blocker / "reading")
    with pytest.raises(OSError), foreground.answering():
        pass
    blocker.unlink()
    with foreground.stepping_aside():
        pass  # recounts: a question counted in would take the lock here, and keep it
    assert not foreground.busy()


def test_a_whole_reading_paused_between_its_batches_remembers_the_speed_it_read_at(tiny_model, tmp_path: Path, monkeypatch) -> None:
    """A pause (a question elsewhere, the server's other work) is not reading time: each pause
    here lasts 1,000 s on the reading's clock, and the remembered speed is that of the batches."""
    document = Document(path=Path("notes.txt"), kind="text", text="The boat was named the Grey Heron. " * 120)
    held_s = [0.0]
    clock = SimpleNamespace(perf_counter=lambda: time.perf_counter() + held_s[0])
    monkeypatch.setattr(events, "time", clock)
    monkeypatch.setattr(cache_module, "time", clock)
    speeds = ReadingSpeeds(tmp_path / "speeds.json", "tiny")
    settings = AskSettings(method=SnapKV(budget=64, window=16), read="full", threads=2, n_batch=256)
    conversation = Conversation(tiny_model, "tiny", document, settings, speeds=speeds)
    try:
        for event in conversation.open():
            if isinstance(event, Progress):
                held_s[0] += 1000.0  # held here for 1,000 s
        n_tokens = len(conversation.document_tokens)
        assert held_s[0] >= 5000 and n_tokens > 1024
        assert speeds.measured("read") > n_tokens / 1000.0  # read in well under one pause's 1,000 s
    finally:
        conversation.close()


def test_a_reading_in_progress_tells_the_time_left_from_its_reading_time_not_its_pauses(tmp_path: Path, monkeypatch) -> None:
    """Another process awaits a reading, or reads fast, by the time its record says is left: the
    record counts the seconds spent reading from its first progress (a saved part loaded before
    it is not read), not the 1,000 s its consumer holds each event (a question elsewhere), nor
    a batch stopped part-way (read again after the question)."""
    clock = [0.0]
    monkeypatch.setattr(events, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(in_progress, "PROGRESS_EVERY_S", 0.0)  # every progress written

    def read() -> Generator[Event, None, None]:
        clock[0] += 50.0  # loading the first 100 tokens' saved reading
        yield Progress(done=100, total=1100, elapsed_s=0.0)
        for done in (300, 500):
            clock[0] += 3.0  # a batch stopped part-way for a question: told again, unchanged, and read again
            yield Progress(done=done - 200, total=1100, elapsed_s=0.0)
            clock[0] += 2.0  # 200 tokens in 2 s: 100 tokens/s
            yield Progress(done=done, total=1100, elapsed_s=0.0)

    readings = ReadingsInProgress(tmp_path)
    for _ in read_alone(readings, ("0" * 40, "notes.txt", "model", 1100), lambda: False, read):
        clock[0] += 1000.0
        (record,) = readings.entries()
    assert (record.read_from, record.done, record.read_s) == (100, 500, 4.0)
    assert record.tokens_per_s == 100.0 and record.left_s == 6.0  # 600 tokens at 100 tokens/s
