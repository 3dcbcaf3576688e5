"""Serve many chat requests on one model: a bounded queue, one thread for all model work, and
continuous batching of the answers.

A request waits in the queue until a sequence of the shared context is free, is read and pruned
on a context of its own (prepared.py), moves into that sequence, and from then on gets one token
per decode step, batched with every other answer in progress (answers.py).

Nobody waits for somebody else's long reading: up to `max_readings` requests are read at once,
and time is shared fairly. The reading that has taken the least time so far reads next (a short
question asked during the reading of a book is read at once, the book's next chunk after); after
each chunk of reading the answers in progress decode for as long as that chunk took (at least one
step each), and longer while one of them has taken less time than every reading: a short
question's answer ends before the book reads on. Each reading
reserves the sequence it will move into, so at most as many are read as sequences are free. When
nothing else is to do, documents that a fast reading answered are read whole (background_readings.py),
while no other kvchat process answers a question; while this one reads or answers, it holds the
foreground, and the background readings of the others pause (engine/kvcache/foreground.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvchat.engine import PAUSED_CHECK_S, Engine, HeldWhileBusy, KvLayout, PreparedPrompt, batches_stop_while
from kvchat.errors import CancelledError, InternalError, KvchatError
from kvchat.events import Done, Event, LaterReading, Token
from kvchat.llama import LlamaModel, Sampler, SamplerSettings
from kvchat.serving.answers import AnswersInProgress
from kvchat.serving.jobs import ChatJob, QueueFull, ShuttingDown
from kvchat.serving.background_readings import BackgroundReadings, ReadLater, read_later
from kvchat.serving.prepared import prepare
from kvchat.serving.requests import ChatRequest
from kvchat.serving.slots import SlotDecoder

LOGGER = logging.getLogger(__name__)

# What the scheduler runs the model with (a fake engine's, in tests): the reading and pruning of a
# request, which returns its PreparedPrompt (or the Done of an answer in parts); the shared context's sequences;
# a sampler chain; the whole reading of a document a fast reading answered (background_readings.py).
Prepare = Callable[[Engine, ChatRequest, threading.Event, Sampler], Iterator[Event]]
NewDecoder = Callable[[LlamaModel, int, int, int | None, KvLayout], SlotDecoder]
NewSampler = Callable[[SamplerSettings], Sampler]


@dataclass
class _JobBeingRead:
    """A job being read and pruned: its events end by returning its PreparedPrompt (or, for a
    question about the whole document, answered part by part as it was read, its Done)."""

    job: ChatJob
    sampler: Sampler
    events: Iterator[Event]
    used_s: float = 0.0  # the time its reading took so far
    answering: bool = False  # an answer in parts whose text has begun


class Scheduler:
    def __init__(
        self, engine: Engine, n_slots: int, slot_cells: int, max_waiting: int = 16, threads: int | None = None,
        layout: KvLayout = KvLayout(), max_readings: int = 2, *, prepare: Prepare = prepare,
        new_decoder: NewDecoder = SlotDecoder, new_sampler: NewSampler = Sampler, read_later: ReadLater = read_later,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.engine = engine
        self._prepare_request = prepare
        self._new_sampler = new_sampler
        self.decoder = new_decoder(engine.model, n_slots, slot_cells, threads, layout)
        self._waiting: queue.Queue[ChatJob] = queue.Queue(max_waiting)
        self._answers = AnswersInProgress(engine, self.decoder, lambda: self._stopping, clock)
        self.max_readings = max_readings  # each holds a context of its own while it reads
        self._readings: list[_JobBeingRead] = []  # in turn order: of those that took least time, the first reads next
        self._clock = clock  # what the fair share of time is measured by
        self._readings_on = BackgroundReadings(engine, read_later)
        self._answering = HeldWhileBusy(engine.foreground)  # the foreground, while a question is read or answered here
        self._to_read: queue.SimpleQueue[tuple[ChatRequest, LaterReading]] = queue.SimpleQueue()  # documents uploaded, for _readings_on
        self._wake = threading.Event()
        self._stopping = False
        self._submitting = threading.Lock()  # no job slips into the queue after the last one was refused
        self._thread = threading.Thread(target=self._run, name="kvchat-model", daemon=True)
        self._thread.start()

    def submit(self, job: ChatJob) -> None:
        """Queue a job; raises QueueFull when the waiting line is full, ShuttingDown once stopped."""
        if job.request.settings.layout != self.decoder.layout:
            raise ValueError(f"a job read with {job.request.settings.layout} cannot move into sequences of {self.decoder.layout}")
        with self._submitting:
            if self._stopping:
                raise ShuttingDown
            try:
                self._waiting.put_nowait(job)
            except queue.Full:
                raise QueueFull from None
        self._wake.set()

    def read_later(self, request: ChatRequest, later: LaterReading = LaterReading.WHOLE) -> None:
        """Read `request`'s document as `later` says (its passages, or whole) and save that while
        the model has nothing else to do (an upload: the questions after its first then load it)."""
        self._to_read.put((request, later))
        self._wake.set()

    @property
    def load(self) -> dict[str, object]:
        return {
            "answering": len(self._answers), "reading": len(self._readings),
            "waiting": self._waiting.qsize(), "sequences": len(self.decoder.slots),
            "reading_on": len(self._readings_on), "reading_on_progress": self._readings_on.progress(),
        }

    def stop(self) -> None:
        """Stop every job without waiting: answers in progress end as "cancelled" after their
        current step, readings at their next chunk, waiting jobs get ShuttingDown."""
        with self._submitting:
            self._stopping = True
        for reading in list(self._readings):  # a copy: the model thread changes the list
            reading.job.cancel.set()
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the model thread to end (after stop()): it emits nothing afterwards."""
        self._thread.join(timeout)

    def close(self) -> None:
        """Stop every job, wait for the model thread, free the shared context."""
        self.stop()
        self.join(timeout=60)
        self.decoder.close()

    # ---- the model thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        finally:  # a model thread that dies does not hold the other processes' readings up
            self._answering.hold(False)

    def _serve(self) -> None:
        while not self._stopping:
            self._wake.clear()  # before looking: a submit() from now on wakes the wait below
            while not self._to_read.empty():
                self._readings_on.add(*self._to_read.get_nowait())
            self._admit()
            busy = bool(self._readings or self._answers)
            self._answering.hold(busy)  # other processes' background readings pause meanwhile
            if self._readings:
                self._answer_for(self._read_next())
            elif self._answers:
                self._answers.step()
            if busy:
                continue
            if self._readings_on and not self.engine.foreground.busy():  # no other process answers now
                with batches_stop_while(self._question_comes):  # one that comes stops its batch part-way
                    self._readings_on.step()
            else:
                self._wake.wait(PAUSED_CHECK_S if self._readings_on else None)
        self._answering.hold(False)  # the shutdown's last answers are not questions to wait for
        for reading in list(self._readings):
            if reading.answering:  # as an answer in progress: it ends as stopped, with what it said
                self._end_answer_in_parts(reading)
            else:
                reading.events.close()  # its context is freed
                self._end_reading(reading, ShuttingDown())
        self._answers.cancel_all()
        while not self._waiting.empty():
            self._waiting.get_nowait().emit(ShuttingDown())
        self._readings_on.close()

    def _question_comes(self) -> bool:
        """Whether a request waits here, the server stops, or another kvchat process answers a question."""
        return self._stopping or not self._waiting.empty() or self.engine.foreground.lately_busy()

    def _admit(self) -> None:
        """Start reading waiting jobs, in the order they came, while a sequence is free for each
        and fewer than `max_readings` are read; each then takes its turn after those before it."""
        while not self._stopping and self._room_to_admit():
            job = self._waiting.get_nowait()
            if job.cancel.is_set():
                continue
            sampler = self._new_sampler(job.request.settings.sampler)
            self._readings.append(_JobBeingRead(job, sampler, self._reading_events(job, sampler)))

    def _room_to_admit(self) -> bool:
        """A job waits, and there is room to read it: a free sequence, and fewer than max_readings read."""
        return (not self._waiting.empty() and len(self._readings) < self.max_readings
                and len(self._readings) + len(self._answers) < len(self.decoder.slots))

    def _reading_events(self, job: ChatJob, sampler: Sampler) -> Iterator[Event]:
        """The rest of the document's whole reading if one is under way (then the job loads it),
        then the job's own reading and pruning; returns its PreparedPrompt (or an answer in parts' Done)."""
        yield from self._readings_on.rest_of(job.request, job.cancel)
        return (yield from self._prepare_request(self.engine, job.request, job.cancel, sampler))

    def _read_next(self) -> float:
        """The reading that took least time so far reads a chunk (or passes on another event),
        then waits for its turn again; one that is done moves into a sequence and answers.
        Returns the time it took."""
        reading = min(self._readings, key=lambda each: each.used_s)  # counted in `load` while it reads
        started = self._clock()
        try:
            event = next(reading.events)
        except StopIteration as finished:
            self._readings.remove(reading)
            self._start(reading, finished.value)
            return self._clock() - started
        except Exception as error:
            self._readings.remove(reading)
            self._end_reading(reading, self._failure(error))
            return self._clock() - started
        took = self._clock() - started
        reading.used_s += took
        self._readings.remove(reading)
        self._readings.append(reading)  # its turn comes again after the others' (of equal time)
        reading.answering = reading.answering or isinstance(event, Token)
        reading.job.emit(event)
        return took

    def _answer_for(self, read_s: float) -> None:
        """After a chunk of reading that took `read_s`: the answers in progress decode for as
        long (at least one step), and on while one of them took less time so far than every
        reading; a job waiting that there is room to read ends the turn."""
        started = self._clock()
        while self._answers and not self._stopping:
            self._answers.step()
            if self._room_to_admit():
                return
            behind = (bool(self._readings and self._answers)
                      and self._answers.least_used_s() < min(r.used_s for r in self._readings))
            if self._clock() - started >= read_s and not behind:
                return

    def _end_answer_in_parts(self, reading: _JobBeingRead) -> None:
        """An answer in parts, its job cancelled (stop() did), runs on to its next check of the
        cancel, where it ends with what it said so far (in_parts.answer_in_parts)."""
        try:
            while True:
                reading.job.emit(next(reading.events))
        except StopIteration as finished:
            self._start(reading, finished.value)
        except Exception:
            self._end_reading(reading, ShuttingDown())

    def _end_reading(self, reading: _JobBeingRead, error: KvchatError) -> None:
        """The job fails with `error`, sent without its traceback: the traceback's frames hold
        the reading's tokens and text (tens of MB for a long document) for as long as the error
        lives, and the error of a client that left lives until the garbage collector's next full
        pass (it is part of a cycle)."""
        reading.sampler.close()
        reading.job.emit(error.with_traceback(None))

    def _failure(self, error: Exception) -> KvchatError:
        """What a job whose preparation raised `error` is told (called while handling it)."""
        if self._stopping and isinstance(error, CancelledError):
            return ShuttingDown()
        if not isinstance(error, KvchatError):  # a bug: the job fails, the server goes on
            LOGGER.exception("preparing a chat request failed")
            return InternalError(f"internal error: {error}", "see the server's log file")
        return error

    def _start(self, reading: _JobBeingRead, prepared: PreparedPrompt | Done) -> None:
        """Move a prepared prompt into a free sequence, where it answers; a question answered in
        parts while it was read is done. The document is read whole later where the answer says so
        (read_later)."""
        job = reading.job
        if isinstance(prepared, Done):
            reading.sampler.close()
            if prepared.read_later:
                self._readings_on.add(job.request, prepared.read_later)
            return job.emit(prepared)
        try:
            self._answers.start(job, prepared, reading.sampler, reading.used_s)
        except Exception as error:
            return self._end_reading(reading, self._failure(error))
        if prepared.read_later:
            self._readings_on.add(job.request, prepared.read_later)
