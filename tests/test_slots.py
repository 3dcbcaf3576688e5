"""Serving mechanics on the tiny GGUF: prompts moved into sequences of a shared context, batched
decode steps, the scheduler's bookkeeping, and saved readings of pasted chats."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from kvchat.engine import AskSettings, Engine, KvLayout
from kvchat.engine.prompt import chat_tokens
from kvchat.engine.prompt_run import PromptRun
from kvchat.errors import KvchatError
from kvchat.events import Done, Token
from kvchat.llama import Sampler
from kvchat.policy import SnapKV
from kvchat.serving.requests import ChatRequest, prepare
from kvchat.serving.scheduler import ChatJob, Scheduler
from kvchat.serving.slots import SlotDecoder

from inspect_helpers import last_logits

SETTINGS = AskSettings(method=SnapKV(budget=96, window=16), max_tokens=8)
LONG = " ".join(f"item {i} costs {i * 7} coins." for i in range(120))


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path):
    with Engine(str(tiny_model_path), use_cache=False) as engine:
        yield engine


def _finish(events):
    while True:
        try:
            next(events)
        except StopIteration as finished:
            return finished.value


def _prepared(engine: Engine, text: str, settings: AskSettings = SETTINGS, messages: tuple = ()):
    messages = messages or ({"role": "user", "content": text},)
    sampler = Sampler(settings.sampler)
    try:
        return _finish(prepare(engine, ChatRequest(settings, messages=messages), threading.Event(), sampler))
    finally:
        sampler.close()


def _single_sequence(engine: Engine, text: str) -> tuple[int, np.ndarray]:
    """The reference, as `kvchat ask` does it on a context of its own: the greedy first token and
    the logits after decoding it."""
    tokens = chat_tokens(engine.model, [{"role": "user", "content": text}])
    with PromptRun(engine.model, 4096, SETTINGS, "tiny") as run:
        list(run.read(tokens, len(tokens) - SETTINGS.method.window))
        list(run.select(tokens, SETTINGS))
        first = int(last_logits(run.cache.ctx).argmax())
        run.cache.decode([first], want_logits=True)
        return first, last_logits(run.cache.ctx)


def _row_logits(decoder: SlotDecoder, row: int) -> np.ndarray:
    from kvchat.llama._lib import raw

    pointer = raw.llama_get_logits_ith(decoder.ctx.handle, row)
    return np.ctypeslib.as_array(pointer, shape=(decoder.model.shape.n_vocab,)).copy()


def test_a_pruned_prompt_moved_into_a_sequence_answers_as_on_its_own_context(engine: Engine) -> None:
    prepared = _prepared(engine, LONG)
    assert len(prepared.positions) <= SETTINGS.method.budget < prepared.selected.n_prompt
    first, logits_after_first = _single_sequence(engine, LONG)
    assert prepared.first_token == first
    decoder = SlotDecoder(engine.model, n_slots=3, slot_cells=512)
    try:
        decoder.ctx.decode(engine.model.tokenize("something else entirely"), 0, seq=0, want_logits=False)
        slot = decoder.slots[1]
        decoder.load(slot, prepared.state, prepared.positions)
        assert slot.cells == len(prepared.positions) and slot.next_pos == prepared.positions[-1] + 1 and slot.busy
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
            decoder.load(a, first.state, first.positions)
            decoder.load(b, second.state, second.positions)
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


def _request(text: str, max_tokens: int = 8) -> ChatRequest:
    settings = AskSettings(method=SETTINGS.method, max_tokens=max_tokens)
    return ChatRequest(settings, messages=({"role": "user", "content": text},))


class Recorder:
    """A job's emit: keeps its events; `ended` is set by the last one (a Done or an error)."""

    def __init__(self, cancel_after_tokens: int | None = None) -> None:
        self.events: list = []
        self.ended = threading.Event()
        self.job: ChatJob | None = None
        self.cancel_after_tokens = cancel_after_tokens

    def __call__(self, event) -> None:
        self.events.append(event)
        if sum(isinstance(e, Token) for e in self.events) == self.cancel_after_tokens:
            self.job.cancel.set()  # the client goes away
        if isinstance(event, (Done, KvchatError)):
            self.ended.set()


def _job(request: ChatRequest, recorder: Recorder) -> ChatJob:
    recorder.job = ChatJob(request, recorder)
    return recorder.job


def test_the_scheduler_answers_every_job_and_empties_every_sequence(engine: Engine) -> None:
    scheduler = Scheduler(engine, n_slots=2, slot_cells=512, max_waiting=8)
    answered = [Recorder() for _ in range(4)]
    dropped, stopped = Recorder(), Recorder(cancel_after_tokens=3)
    jobs = [_job(_request(f"{LONG} {i}"), recorder) for i, recorder in enumerate(answered)]
    jobs.append(_job(_request(LONG), dropped))
    dropped.job.cancel.set()  # gone while still waiting
    jobs.append(_job(_request(LONG, max_tokens=400), stopped))
    try:
        for job in jobs:
            scheduler.submit(job)
        assert all(recorder.ended.wait(60) for recorder in [*answered, stopped])
        for recorder in answered:
            done = recorder.events[-1]
            assert isinstance(done, Done) and 1 <= done.stats.generated_tokens <= 8
        assert dropped.events == []  # passed over: it was taken from the queue before `stopped`
        stop, pieces = stopped.events[-1], [e.text for e in stopped.events if isinstance(e, Token)]
        assert stop.stats.stop_reason == "cancelled" and stop.stats.generated_tokens < 400
        assert len(pieces) in (3, 4) and stop.answer == "".join(pieces)  # 4: the detokenizer's flushed tail
        # each answer's cells are dropped before its Done: nothing is kept for a follow-up
        assert [(slot.busy, slot.cells) for slot in scheduler.decoder.slots] == [(False, 0), (False, 0)]
    finally:
        scheduler.close()


def _failing(error: Exception):
    def fail(*_args: object) -> None:
        raise error
    return fail


def _events_of(scheduler: Scheduler, job_text: str) -> list:
    recorder = Recorder()
    scheduler.submit(_job(_request(job_text), recorder))
    assert recorder.ended.wait(60), "the job never ended"
    return recorder.events


def test_a_state_llama_cpp_refuses_fails_that_request_and_the_server_goes_on(engine: Engine, monkeypatch) -> None:
    scheduler = Scheduler(engine, n_slots=1, slot_cells=512, max_waiting=4)
    load = scheduler.decoder.load
    try:
        with monkeypatch.context() as patch:
            patch.setattr(scheduler.decoder, "load", _failing(KvchatError("failed to restore kv cache", "")))
            refused = _events_of(scheduler, "first")
        assert isinstance(refused[-1], KvchatError) and "restore" in str(refused[-1])
        slot = scheduler.decoder.slots[0]
        assert scheduler.decoder.load == load and not slot.busy and slot.cells == 0
        assert isinstance(_events_of(scheduler, "second")[-1], Done)
    finally:
        scheduler.close()


def test_a_failed_decode_step_fails_the_answers_in_progress_and_the_server_goes_on(engine: Engine, monkeypatch) -> None:
    scheduler = Scheduler(engine, n_slots=1, slot_cells=512, max_waiting=4)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(scheduler.decoder, "step", _failing(RuntimeError("llama_decode returned -3")))
            failed = _events_of(scheduler, "first")
        assert isinstance(failed[-1], KvchatError) and "decoding failed" in str(failed[-1])
        assert isinstance(_events_of(scheduler, "second")[-1], Done)
    finally:
        scheduler.close()


def test_a_job_read_with_another_cache_layout_is_refused(engine: Engine) -> None:
    scheduler = Scheduler(engine, n_slots=1, slot_cells=512, max_waiting=4)
    try:
        settings = AskSettings(method=SETTINGS.method, layout=KvLayout(flash_attn=True))
        with pytest.raises(ValueError, match="cannot move into"):
            scheduler.submit(ChatJob(ChatRequest(settings, messages=({"role": "user", "content": "hi"},)), lambda _event: None))
    finally:
        scheduler.close()


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
