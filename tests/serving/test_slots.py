"""Serving: the mechanics on the tiny GGUF (prompts moved into sequences of a shared context,
batched decode steps, saved readings of pasted chats), then the scheduler's behaviour on the fake
engine (queueing, batching, cancelling, stopping, failures), step by step under the test's control."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.fake_engine import WAIT_S, Emitted, FakeEngine, Log, Script
from tests.inspect_helpers import last_logits, returned
from kvchat.documents import Document
from kvchat.engine import AskSettings, Engine, KvLayout, Turn
from kvchat.engine.kvcache.foreground import Foreground
from kvchat.engine.prompt import chat_tokens
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.errors import CancelledError, InternalError, KvchatError, PromptTooLongError, SettingsError
from kvchat.events import Done, LaterReading, Progress, Token
from kvchat.llama import Sampler
from kvchat.policy import SnapKV
from kvchat.serving.background_readings import BackgroundReadings
from kvchat.serving.prepared import prepare
from kvchat.serving.requests import ChatRequest
from kvchat.serving.jobs import ChatJob, QueueFull, ShuttingDown
from kvchat.serving.scheduler import Scheduler
from kvchat.serving.slots import SlotDecoder

SETTINGS = AskSettings(method=SnapKV(budget=96, window=16), max_tokens=8)
LONG = " ".join(f"item {i} costs {i * 7} coins." for i in range(120))


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path):
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        yield engine


def _prepared(engine: Engine, text: str, settings: AskSettings = SETTINGS, messages: tuple = ()):
    messages = messages or ({"role": "user", "content": text},)
    sampler = Sampler(settings.sampler)
    try:
        return returned(prepare(engine, ChatRequest(settings, messages=messages), threading.Event(), sampler))
    finally:
        sampler.close()


def _single_sequence(engine: Engine, text: str, settings: AskSettings = SETTINGS) -> tuple[int, np.ndarray]:
    """The reference, as `kvchat ask` does it on a context of its own: the greedy first token and
    the logits after decoding it."""
    tokens = chat_tokens(engine.model, [{"role": "user", "content": text}])
    with PromptRun(engine.model, 4096, settings, "tiny") as run:
        list(run.read(tokens, len(tokens) - settings.method.window))
        list(run.select(tokens, settings))
        first = int(last_logits(run.cache.ctx).argmax())
        run.cache.decode([first], want_logits=True)
        return first, last_logits(run.cache.ctx)


def _row_logits(decoder: SlotDecoder, row: int) -> np.ndarray:
    from kvchat.llama._lib import raw

    pointer = raw.llama_get_logits_ith(decoder.ctx.handle, row)
    return np.ctypeslib.as_array(pointer, shape=(decoder.model.shape.n_vocab,)).copy()


@pytest.mark.parametrize("heads", ["sum", "per-head"])
def test_a_pruned_prompt_moved_into_a_sequence_answers_as_on_its_own_context(engine: Engine, heads: str) -> None:
    settings = replace(SETTINGS, method=replace(SETTINGS.method, heads=heads))
    prepared = _prepared(engine, LONG, settings)
    assert len(prepared.kept.positions) <= SETTINGS.method.budget < prepared.selected.n_prompt
    assert (prepared.kept.head_origins is not None) == (heads == "per-head")
    first, logits_after_first = _single_sequence(engine, LONG, settings)
    assert prepared.first_token == first
    decoder = SlotDecoder(engine.model, n_slots=3, slot_cells=512)
    try:
        decoder.ctx.decode(engine.model.tokenize("something else entirely"), 0, seq=0, want_logits=False)
        slot = decoder.slots[1]
        decoder.load(slot, prepared.kept.state, prepared.kept.positions)
        assert slot.cells == len(prepared.kept.positions) and slot.next_pos == prepared.kept.positions[-1] + 1 and slot.busy
        decoder.step([slot], [prepared.first_token])
        np.testing.assert_allclose(_row_logits(decoder, 0), logits_after_first, atol=1e-4)
    finally:
        decoder.close()


def test_a_batched_step_equals_separate_steps(engine: Engine) -> None:
    first, second = _prepared(engine, LONG), _prepared(engine, LONG.replace("coins", "pearls"))
    rows = {}
    for together in (True, False):
        decoder = SlotDecoder(engine.model, n_slots=2, slot_cells=512)
        try:
            a, b = decoder.slots
            decoder.load(a, first.kept.state, first.kept.positions)
            decoder.load(b, second.kept.state, second.kept.positions)
            if together:
                decoder.step([a, b], [first.first_token, second.first_token])
                rows[together] = (_row_logits(decoder, 0), _row_logits(decoder, 1))
            else:
                decoder.step([a], [first.first_token])
                row_a = _row_logits(decoder, 0)
                decoder.step([b], [second.first_token])
                rows[together] = (row_a, _row_logits(decoder, 0))
        finally:
            decoder.close()
    for batched, alone in zip(rows[True], rows[False]):
        np.testing.assert_allclose(batched, alone, atol=1e-3)
    assert not np.allclose(rows[True][0], rows[True][1])  # two different conversations


def test_a_pasted_chat_reading_is_saved_and_loaded_for_the_follow_up(tiny_model_path: Path) -> None:
    with Engine(str(tiny_model_path), use_cache=True) as engine:
        first = _prepared(engine, LONG)
        assert first.selected.loaded_tokens == 0
        second = _prepared(engine, "", messages=(
            {"role": "user", "content": LONG},  # the same first message: the conversation goes on
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "And item 7?"},
        ))
        assert second.selected.loaded_tokens == first.selected.n_prompt - SETTINGS.method.window
        assert second.selected.n_prompt > first.selected.n_prompt


# ---- the scheduler on the fake engine (tests/fake_engine.py): exact, no model ------------------

FAKE_SETTINGS = AskSettings(method=SETTINGS.method, max_tokens=64)


@contextmanager
def running(fake: FakeEngine, **sizes: int) -> Iterator[Scheduler]:
    scheduler = fake.scheduler(**sizes)
    try:
        yield scheduler
    finally:
        scheduler.close()


def _submit(scheduler: Scheduler, question: str) -> tuple[ChatJob, Emitted]:
    emitted = Emitted()
    job = ChatJob(ChatRequest(FAKE_SETTINGS, messages=({"role": "user", "content": question},)), emitted)
    scheduler.submit(job)
    return job, emitted


def _questions(fake: FakeEngine) -> list[str]:
    """The questions the scheduler read, in order."""
    return [reading.request.messages[-1]["content"] for reading in fake.readings.items]


def _steps(fake: FakeEngine) -> list[tuple[tuple[int, ...], str, tuple[int, ...]]]:
    """Each decode step: its sequences, the tokens it fed them (as text) and their positions."""
    assert fake.decoder is not None
    return [(step.seqs, bytes(step.tokens).decode(), step.positions) for step in fake.decoder.steps.items]


def _done(emitted: Emitted) -> Done:
    done = emitted.ended()[-1]
    assert isinstance(done, Done), done
    return done


def test_answers_in_progress_share_each_step_in_the_order_they_started() -> None:
    fake = FakeEngine({"A": Script("abc", paced=True), "B": Script("de", chunks=0), "C": Script("fghi", chunks=0)})
    with running(fake, n_slots=3) as scheduler:
        _, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        (_, b), (_, c) = _submit(scheduler, "B"), _submit(scheduler, "C")
        reading.allow()  # A moves into a sequence; B, then C (once B's reading ended), follow it a step apart
        answers = {name: _done(emitted) for name, emitted in (("A", a), ("B", b), ("C", c))}
    # one token each per step, in the order they started; an answer leaves once it sampled END
    assert _steps(fake) == [((0,), "a", (100,)), ((0, 1), "bd", (101, 100)), ((0, 1, 2), "cef", (102, 101, 100)),
                            ((2,), "g", (101,)), ((2,), "h", (102,)), ((2,), "i", (103,))]
    assert fake.decoder.releases.items == [0, 1, 2]  # A ended first (in the step where B did), then B, then C
    assert (a.tokens, b.tokens, c.tokens) == (list("abc"), list("de"), list("fghi"))
    for name, steps in (("A", 3), ("B", 2), ("C", 4)):
        stats = answers[name].stats
        assert answers[name].answer == fake.scripts[name].answer
        assert (stats.prompt_tokens, stats.loaded_tokens, stats.read_tokens, stats.kept_tokens) == (100, 0, 100, 40)
        assert (stats.generated_tokens, stats.stop_reason, stats.peak_cells) == (steps, "stop", 40 + steps)
    assert len(fake.samplers) == 3 and all(sampler.closed for sampler in fake.samplers)
    assert [(slot.busy, slot.cells) for slot in fake.decoder.slots] == [(False, 0)] * 3


def test_answers_in_progress_get_a_step_after_each_chunk_of_a_reading() -> None:
    fake = FakeEngine({"A": Script("abcdef", paced=True), "B": Script("xy", prompt_tokens=300, loaded_tokens=200, chunks=3)})
    with running(fake, n_slots=2) as scheduler:
        _, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        _, b = _submit(scheduler, "B")
        reading.allow()
        first, second = _done(a), _done(b)
    assert [(seqs, tokens) for seqs, tokens, _ in _steps(fake)] == [
        ((0,), "a"),  # once A moved in
        ((0,), "b"), ((0,), "c"), ((0,), "d"),  # one after each of B's three chunks
        ((0, 1), "ex"), ((0, 1), "fy"),  # B moved in: it ends with A
    ]
    assert (first.answer, second.answer) == ("abcdef", "xy")
    stats = second.stats
    assert (stats.prompt_tokens, stats.loaded_tokens, stats.read_tokens, stats.kept_tokens) == (300, 200, 100, 40)


def test_a_question_answered_in_parts_streams_while_it_is_read_and_takes_no_sequence() -> None:
    fake = FakeEngine({"A": Script("abcdef", paced=True), "P": Script("xyz", chunks=3, in_parts=True, unread=True)},
                      saves_readings=True)
    with running(fake, n_slots=2) as scheduler:
        _, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        parts = _ask_about(scheduler, "P")
        reading.allow()
        first, answered = _done(a), _done(parts)
        fake.whole_allowed.release(3)  # the document itself is then read whole, for the questions after it
        fake.order.wait_for(lambda items: "whole P closed" in items)
    assert parts.tokens == list("xyz") and (answered.answer, answered.stats.read) == ("xyz", "in 3 parts")
    assert [(seqs, tokens) for seqs, tokens, _ in _steps(fake)] == [((0,), token) for token in "abcdef"]  # A's alone
    assert fake.decoder.releases.items == [0] and all(sampler.closed for sampler in fake.samplers)
    assert first.answer == "abcdef"


def test_stopping_ends_an_answer_in_parts_under_way_with_what_it_said() -> None:
    fake = FakeEngine({"P": Script("xyz", chunks=3, paced=True, in_parts=True)})
    with running(fake) as scheduler:
        parts = _ask_about(scheduler, "P")
        (reading,) = fake.readings.wait_len(1)
        reading.allow()
        parts.wait_for(lambda items: Token("x") in items)
        scheduler.stop()
        reading.allow()  # its next check of the cancel
        scheduler.join(WAIT_S)
    stopped = parts.ended()[-1]
    assert parts.tokens == ["x"] and isinstance(stopped, Done) and reading.outcome == "stopped"
    assert (stopped.answer, stopped.stats.stop_reason) == ("x", "cancelled")
    assert all(sampler.closed for sampler in fake.samplers) and fake.decoder.releases.items == []


def test_a_short_question_is_read_and_answered_between_the_chunks_of_a_long_reading() -> None:
    fake = FakeEngine({"book?": Script("long", prompt_tokens=10_000, chunks=20, paced=True), "hi": Script("ok")})
    with running(fake, n_slots=2) as scheduler:
        book_job, book = _submit(scheduler, "book?")
        (reading,) = fake.readings.wait_len(1)
        _, hi = _submit(scheduler, "hi")
        reading.allow(4)  # "hi" reads its chunk after chunk 2, moves in and answers after chunk 3, ends after chunk 4
        assert _done(hi).answer == "ok"
        assert reading.chunks_read.items == [1, 2, 3, 4] and reading.outcome == ""  # the book's reading goes on
        assert scheduler.load["reading"] == 1 and book.progress.items[-1] == Progress(2000, 10_000, 0.0)
        book_job.cancel.set()
        reading.allow()
        assert isinstance(book.ended()[-1], CancelledError)
    assert [(seqs, tokens) for seqs, tokens, _ in _steps(fake)] == [((0,), "o"), ((0,), "k")]


def test_time_is_shared_a_short_question_reads_first_and_answers_before_the_book_reads_on() -> None:
    """On the scheduler's clock a chunk of the book takes 10 s and a step 1 s: "hi" (no time used)
    is read before the book's next chunk, and its answer decodes until it took as long as the
    book's reading (10 steps); after the book's next chunk, as long as that chunk took."""
    fake = FakeEngine({"book?": Script("long", prompt_tokens=10_000, chunks=20, paced=True, chunk_s=10.0),
                       "hi": Script("abcdefghijkl", chunks=2)}, step_s=1.0)
    with running(fake, n_slots=2) as scheduler:
        book_job, book = _submit(scheduler, "book?")
        (reading,) = fake.readings.wait_len(1)
        _, hi = _submit(scheduler, "hi")
        reading.allow(2)
        assert _done(hi).answer == "abcdefghijkl"
        assert reading.chunks_read.items == [1, 2] and reading.outcome == ""
        book_job.cancel.set()
        reading.allow()
        assert isinstance(book.ended()[-1], CancelledError)
    # "hi" read both its chunks and moved in before the book's 2nd chunk: 10 steps then, 2 after it
    assert [tokens for _, tokens, _ in _steps(fake)] == list("abcdefghijkl")


def test_a_job_waiting_without_room_to_be_read_does_not_cut_the_answers_turn() -> None:
    """One reading at a time: while the book is read, "later" waits; the answer in progress still
    decodes for as long as each chunk of the book took (3 steps of 1 s after a 3 s chunk)."""
    fake = FakeEngine({"answer": Script("abcdefgh", paced=True), "book?": Script("long", chunks=20, paced=True, chunk_s=3.0)},
                      step_s=1.0)
    with running(fake, n_slots=3, max_readings=1) as scheduler:
        _, answer = _submit(scheduler, "answer")
        (answering,) = fake.readings.wait_len(1)
        book_job, _ = _submit(scheduler, "book?")
        answering.allow()  # "answer" moves in; then the book is read, while "later" waits its turn
        _, book = fake.readings.wait_len(2)
        _, later = _submit(scheduler, "later")
        book.allow(3)
        assert _done(answer).answer == "abcdefgh"
        assert book.chunks_read.items == [1, 2, 3] and later.items == []
        book_job.cancel.set()
        book.allow()
        assert _done(later).answer == "ok"
    steps = [tokens for _, tokens, _ in _steps(fake)]
    assert steps[:8] == list("abcdefgh")  # one as "answer" moved in, 3 after each of 2 chunks, the last after the 3rd


def test_at_most_max_readings_are_read_at_once_and_each_reserves_a_sequence() -> None:
    fake = FakeEngine({"A": Script("a", chunks=2, paced=True), "B": Script("b", chunks=2, paced=True),
                       "C": Script("c", chunks=2, paced=True)})
    with running(fake, n_slots=3, max_readings=2) as scheduler:
        _, a = _submit(scheduler, "A")
        (first,) = fake.readings.wait_len(1)
        (_, b), (_, c) = _submit(scheduler, "B"), _submit(scheduler, "C")
        first.allow(2)  # A reads its chunks in turn with B's first
        _, second = fake.readings.wait_len(2)
        assert scheduler.load == {"answering": 0, "reading": 2, "waiting": 1, "sequences": 3, "reading_on": 0, "reading_on_progress": []}
        second.allow(2)
        assert _done(a).answer == "a"  # C is read once A's reading ended
        fake.readings.wait_len(3)[2].allow(2)
        assert (_done(b).answer, _done(c).answer) == ("b", "c")
    assert _questions(fake) == ["A", "B", "C"]
    assert [len(emitted.progress.items) for emitted in (a, b, c)] == [2, 2, 2]


NOTES = Document(path=Path("notes.txt"), kind="text", text="The boat was named the Grey Heron.")


def _ask_about(scheduler: Scheduler, question: str) -> Emitted:
    emitted = Emitted()
    scheduler.submit(ChatJob(ChatRequest(FAKE_SETTINGS, document=NOTES, question=question), emitted))
    return emitted


def test_a_document_a_fast_reading_answered_is_read_whole_only_while_no_answer_is_in_progress() -> None:
    fake = FakeEngine({"Boat?": Script("abc", unread=True)}, held_steps=True, saves_readings=True)
    with running(fake) as scheduler:
        first = _ask_about(scheduler, "Boat?")
        fake.whole_allowed.release(3)  # allowed from the start, yet not read while the answer is in progress
        fake.decoder.allow(3)
        assert _done(first).answer == "abc"
        fake.order.wait_for(lambda items: "whole Boat? closed" in items)
    assert fake.order.items == ["prepare Boat?", *(f"whole Boat? {chunk} after 3 steps" for chunk in (1, 2, 3)), "whole Boat? closed"]


def test_a_whole_reading_in_the_background_tells_how_far_it_got_until_it_ends() -> None:
    engine = type("SavesReadings", (), {"states": object()})()
    readings = BackgroundReadings(engine, lambda _engine, _request, _later: iter([Progress(512, 1024, 1.0), Progress(1024, 1024, 2.0)]))
    readings.add(ChatRequest(FAKE_SETTINGS, document=NOTES, question="Boat?"), LaterReading.PASSAGES)
    told = [readings.progress()]
    for _ in range(3):  # two chunks, then the end
        readings.step()
        told.append(readings.progress())
    assert told == [[{"document": "notes.txt", "reads": "passages", "done": done, "total": total}]
                    for done, total in ((0, 0), (512, 1024), (1024, 1024))] + [[]]


def test_a_request_about_a_document_being_read_whole_reads_the_rest_of_it_first() -> None:
    fake = FakeEngine({"Boat?": Script("", unread=True), "Radio?": Script("")}, saves_readings=True)
    with running(fake) as scheduler:
        _done(_ask_about(scheduler, "Boat?"))
        follow_up = _ask_about(scheduler, "Radio?")
        fake.whole_allowed.release(3)
        _done(follow_up)
    assert fake.order.items == ["prepare Boat?", *(f"whole Boat? {chunk} after 0 steps" for chunk in (1, 2, 3)),
                                "whole Boat? closed", "prepare Radio?"]


@pytest.mark.parametrize("turns", [(), (Turn("Radio?", "It failed on day four."),)], ids=["first question", "follow-up"])
def test_an_upload_is_read_whole_while_idle_and_a_question_read_fast_goes_before_the_rest(turns: tuple[Turn, ...]) -> None:
    fake = FakeEngine({"Boat?": Script("")}, saves_readings=True, reads_fast=True)
    with running(fake) as scheduler:
        scheduler.read_later(ChatRequest(FAKE_SETTINGS, document=NOTES))  # as an upload does
        fake.whole_allowed.release()
        fake.order.wait_for(lambda items: "whole  1 after 0 steps" in items)
        boat = Emitted()  # while the reading's second chunk waits
        scheduler.submit(ChatJob(ChatRequest(FAKE_SETTINGS, document=NOTES, question="Boat?", turns=turns), boat))
        fake.whole_allowed.release()
        _done(boat)  # prepared after that chunk, without waiting for the rest of the reading
        fake.whole_allowed.release()
        fake.order.wait_for(lambda items: "whole  closed" in items)
    assert fake.order.items == ["whole  1 after 0 steps", "whole  2 after 0 steps", "prepare Boat?", "whole  3 after 0 steps",
                                "whole  closed"]
    assert fake.asked_after_reading == [2]  # how far the reading had got decides


def test_stopping_drops_an_unfinished_whole_reading_and_none_is_started_where_readings_are_not_saved() -> None:
    fake = FakeEngine({"Boat?": Script("", unread=True)}, saves_readings=True)
    with running(fake) as scheduler:
        _done(_ask_about(scheduler, "Boat?"))
        fake.whole_allowed.release()
        fake.order.wait_for(lambda items: "whole Boat? 1 after 0 steps" in items)
        scheduler.stop()
        fake.whole_allowed.release()  # a chunk under way ends; then the model thread stops
    read = fake.order.items
    assert read[:2] == ["prepare Boat?", "whole Boat? 1 after 0 steps"] and read[-1] == "whole Boat? closed"
    assert "whole Boat? 3 after 0 steps" not in read
    unsaved = FakeEngine({"Boat?": Script("", unread=True)})
    with running(unsaved) as scheduler:
        _done(_ask_about(scheduler, "Boat?"))
        _done(_ask_about(scheduler, "Radio?"))
    assert unsaved.order.items == ["prepare Boat?", "prepare Radio?"]


class _Looks(Foreground):
    """A Foreground that logs what each look (busy()) saw."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.looks: Log[bool] = Log()

    def busy(self) -> bool:
        busy = super().busy()
        self.looks.append(busy)
        return busy


def test_an_upload_is_read_whole_only_while_no_other_kvchat_process_answers_a_question(tmp_path: Path) -> None:
    fake, elsewhere = FakeEngine(saves_readings=True, foreground=_Looks(tmp_path)), Foreground(tmp_path)
    with running(fake) as scheduler:
        with elsewhere.answering():  # as `kvchat ask` in another terminal does
            scheduler.read_later(ChatRequest(FAKE_SETTINGS, document=NOTES))
            fake.whole_allowed.release(3)
            fake.foreground.looks.wait_for(lambda looks: looks.count(True) >= 2)  # it looked again, and read nothing
            assert fake.order.items == []
        fake.order.wait_for(lambda items: "whole  closed" in items)
    assert fake.order.items == [*(f"whole  {chunk} after 0 steps" for chunk in (1, 2, 3)), "whole  closed"]


def test_a_batch_of_a_whole_reading_in_the_background_stops_part_way_for_a_question_elsewhere(tmp_path: Path) -> None:
    fake = FakeEngine(saves_readings=True, foreground=Foreground(tmp_path))
    with running(fake) as scheduler:
        scheduler.read_later(ChatRequest(FAKE_SETTINGS, document=NOTES))
        fake.whole_allowed.release(3)
        fake.order.wait_for(lambda items: "whole  closed" in items)
        stops = fake.stop_checks[0]
        assert len(fake.stop_checks) == 3 and stops is not None and not stops()  # no question now
        with Foreground(tmp_path).answering():
            assert fake.foreground.busy() and stops()  # what stops it: the last look, remembered a moment
    assert stops()  # nor does a batch go on while the server stops


def test_while_a_question_is_read_or_answered_the_server_holds_the_foreground(tmp_path: Path) -> None:
    fake, elsewhere = FakeEngine({"Boat?": Script("abc", paced=True)}, foreground=Foreground(tmp_path)), Foreground(tmp_path)
    with running(fake) as scheduler:
        emitted = _ask_about(scheduler, "Boat?")
        (reading,) = fake.readings.wait_len(1)
        assert elsewhere.busy()  # another process's background reading pauses meanwhile
        reading.allow()
        assert _done(emitted).answer == "abc"
        given_up = threading.Event()
        timer = threading.Timer(WAIT_S, given_up.set)
        timer.start()
        elsewhere.give_way(given_up)  # returns once the server no longer holds it
        timer.cancel()
        assert not given_up.is_set()


def test_a_full_waiting_line_refuses_the_next_job() -> None:
    fake = FakeEngine({"A": Script("a", paced=True)})
    with running(fake, n_slots=1, max_waiting=1) as scheduler:
        _, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        _, b = _submit(scheduler, "B")
        assert scheduler.load == {"answering": 0, "reading": 1, "waiting": 1, "sequences": 1, "reading_on": 0, "reading_on_progress": []}
        refused = Emitted()
        with pytest.raises(QueueFull):
            scheduler.submit(ChatJob(ChatRequest(FAKE_SETTINGS, messages=({"role": "user", "content": "C"},)), refused))
        reading.allow()
        assert (_done(a).answer, _done(b).answer) == ("a", "ok")
    assert refused.items == [] and _questions(fake) == ["A", "B"]


def test_a_job_cancelled_while_waiting_is_passed_over() -> None:
    fake = FakeEngine({"A": Script("a", paced=True)})
    with running(fake, n_slots=1) as scheduler:
        _, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        (dropped, b), (_, c) = _submit(scheduler, "B"), _submit(scheduler, "C")
        dropped.cancel.set()  # its client went away before a sequence was free
        reading.allow()
        assert (_done(a).answer, _done(c).answer) == ("a", "ok")
    assert b.items == [] and _questions(fake) == ["A", "C"] and len(fake.samplers) == 2


def test_a_job_cancelled_while_read_stops_at_the_next_chunk() -> None:
    fake = FakeEngine({"A": Script("a", chunks=3, paced=True)})
    with running(fake, n_slots=1) as scheduler:
        job, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        reading.allow()
        reading.chunks_read.wait_len(1)
        job.cancel.set()
        reading.allow()  # the chunk being read ends; the cancel is seen before the next
        (error,) = a.ended()
        _, b = _submit(scheduler, "B")
        assert _done(b).answer == "ok"  # the scheduler goes on
    assert isinstance(error, CancelledError) and reading.outcome == "cancelled" and reading.chunks_read.items == [1]
    assert fake.decoder.loads.items == [(0, 40)]  # B's prompt only
    assert all(sampler.closed for sampler in fake.samplers)


def test_a_job_cancelled_while_answering_ends_after_its_current_step() -> None:
    fake = FakeEngine({"A": Script("abcdefgh", paced=True), "B": Script("vwxyz", chunks=0)}, held_steps=True)
    with running(fake, n_slots=2) as scheduler:
        job, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        _, b = _submit(scheduler, "B")
        reading.allow()
        fake.decoder.allow(2)
        fake.decoder.steps.wait_len(2)
        job.cancel.set()  # the client goes away while step 3 waits
        fake.decoder.run_free()
        stopped, finished = _done(a), _done(b)
    assert [seqs for seqs, _, _ in _steps(fake)] == [(0,), (0, 1), (0, 1), (1,), (1,), (1,)]  # B moves in after step 1
    assert (stopped.answer, stopped.stats.generated_tokens, stopped.stats.stop_reason) == ("abcd", 4, "cancelled")
    assert (finished.answer, finished.stats.generated_tokens, finished.stats.stop_reason) == ("vwxyz", 5, "stop")
    assert stopped.stats.peak_cells == 40 + 3  # its cells counted before they were dropped


def test_stopping_ends_answers_as_cancelled_and_refuses_the_reading_and_waiting_jobs() -> None:
    fake = FakeEngine({"A": Script("abc", paced=True), "B": Script(until_cancelled=True)})
    with running(fake, n_slots=2) as scheduler:
        _, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        (_, b), (_, c) = _submit(scheduler, "B"), _submit(scheduler, "C")
        reading.allow()  # A answers (its first token), then B's reading waits for its cancel
        fake.readings.wait_len(2)
        assert scheduler.load == {"answering": 1, "reading": 1, "waiting": 1, "sequences": 2, "reading_on": 0, "reading_on_progress": []}
        scheduler.stop()
        with pytest.raises(ShuttingDown):
            _submit(scheduler, "D")
        scheduler.join(WAIT_S)
        events = {name: emitted.ended() for name, emitted in (("A", a), ("B", b), ("C", c))}
    stopped = events["A"][-1]
    assert events["A"][:-1] == [Token("a"), Token("b")] and isinstance(stopped, Done)  # its step once B's reading ended
    assert (stopped.answer, stopped.stats.generated_tokens, stopped.stats.stop_reason) == ("ab", 2, "cancelled")
    assert [type(item) for item in events["B"] + events["C"]] == [ShuttingDown, ShuttingDown]
    assert _questions(fake) == ["A", "B"] and fake.readings.items[1].outcome == "cancelled"
    assert [(seqs, tokens) for seqs, tokens, _ in _steps(fake)] == [((0,), "a")] and fake.decoder.releases.items == [0]
    assert all(sampler.closed for sampler in fake.samplers) and fake.decoder.closed


def test_stopping_between_steps_ends_every_answer_as_cancelled() -> None:
    fake = FakeEngine({"A": Script("abcdef", paced=True), "B": Script("uvwxyz", chunks=0)}, held_steps=True)
    with running(fake, n_slots=2) as scheduler:
        _, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        _, b = _submit(scheduler, "B")
        reading.allow()
        fake.decoder.allow()
        fake.decoder.held_steps.wait_len(2)
        scheduler.stop()  # while step 2 waits
        fake.decoder.run_free()
        answers = [_done(a), _done(b)]
    assert [(done.answer, done.stats.generated_tokens, done.stats.stop_reason) for done in answers] == [
        ("abc", 3, "cancelled"), ("uv", 2, "cancelled")]  # B moved in after step 1
    assert len(_steps(fake)) == 2


def test_a_preparation_that_raises_fails_its_job_and_the_scheduler_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    refused = SettingsError("the request has no messages", "send at least one user message")
    fake = FakeEngine({"bug": Script(error=RuntimeError("a bug")), "refused": Script(error=refused),
                       "too long": Script(prompt_tokens=2000, kept_tokens=512)})
    with running(fake, n_slots=1, slot_cells=512) as scheduler:
        errors = {}
        for question in ("bug", "refused", "too long"):
            _, emitted = _submit(scheduler, question)
            (errors[question],) = emitted.ended()
        _, after = _submit(scheduler, "after")
        assert _done(after).answer == "ok"
    assert isinstance(errors["bug"], InternalError) and not isinstance(errors["refused"], InternalError)
    assert (errors["bug"].message, errors["bug"].hint) == ("internal error: a bug", "see the server's log file")
    assert errors["refused"] is refused
    assert isinstance(errors["too long"], PromptTooLongError)
    assert errors["too long"].message == "the kept prompt is 512 tokens; a sequence holds 512"
    assert [(record.message, record.exc_info[0]) for record in caplog.records if record.exc_info] == [
        ("preparing a chat request failed", RuntimeError)]
    assert fake.decoder.loads.items == [(0, 40)] and all(sampler.closed for sampler in fake.samplers)


def _failing(error: Exception):
    def fail(*_args: object) -> None:
        raise error
    return fail


def test_a_state_the_decoder_refuses_fails_that_job_and_frees_its_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine()
    with running(fake, n_slots=1) as scheduler:
        load = fake.decoder.load
        with monkeypatch.context() as patch:
            patch.setattr(fake.decoder, "load", _failing(KvchatError("failed to restore kv cache", "")))
            _, refused = _submit(scheduler, "first")
            (error,) = refused.ended()
        assert fake.decoder.load == load
        _, after = _submit(scheduler, "second")
        assert _done(after).answer == "ok"
    assert error.message == "failed to restore kv cache"
    assert fake.decoder.releases.items == [0, 0]  # emptied after the refusal, and after the answer


def test_a_failed_decode_step_fails_the_answers_in_it_and_the_scheduler_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeEngine({"A": Script("abcd", paced=True), "B": Script("wxyz", chunks=0)},
                      step_failures={2: RuntimeError("llama_decode returned -3")})
    with running(fake, n_slots=2) as scheduler:
        _, a = _submit(scheduler, "A")
        (reading,) = fake.readings.wait_len(1)
        _, b = _submit(scheduler, "B")
        reading.allow()
        failed = [a.ended(), b.ended()]
        _, c = _submit(scheduler, "C")
        assert _done(c).answer == "ok"
    for emitted, tokens in zip(failed, (["a", "b"], ["w"])):  # B moved in after step 1
        *pieces, error = emitted
        assert [piece.text for piece in pieces] == tokens and isinstance(error, InternalError)
        assert error.message == "decoding failed: llama_decode returned -3"
    assert [seqs for seqs, _, _ in _steps(fake)] == [(0,), (0,), (0,)]  # step 1 (step 2 failed), then C's two
    assert fake.decoder.releases.items == [0, 1, 0]
    assert [record.message for record in caplog.records if record.exc_info] == ["a decode step failed"]


def test_a_job_read_with_another_cache_layout_is_refused() -> None:
    with running(FakeEngine()) as scheduler:
        settings = AskSettings(method=SETTINGS.method, layout=KvLayout(flash_attn=True))
        with pytest.raises(ValueError, match="cannot move into"):
            scheduler.submit(ChatJob(ChatRequest(settings, messages=({"role": "user", "content": "hi"},)), Emitted()))
