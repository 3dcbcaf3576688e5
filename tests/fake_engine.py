"""A fake engine under the server's scheduler and service: scripted readings and answers, no model.

The scheduler takes its preparation, its decoder and its samplers from here (its `prepare`,
`new_decoder` and `new_sampler`), so what it does with them is exact and under the test's control:

- a request's Script (found by its question) says how many prompt tokens it has, how many were
  loaded and kept, how many chunks its reading takes, and its answer;
- a reading can be paced (each chunk waits for the test's `allow`) or last until its job is
  cancelled; decode steps can be held the same way (FakeDecoder.allow);
- every reading, load, step and release is recorded in a Log a test can wait on.

The vocabulary: one token per UTF-8 byte of the answer, then END. A fake prepared prompt's state
holds the rest of its answer (what a real state decides: how the answer goes on), so the decoder
knows what each sequence "samples" next.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Generic, TypeVar

import numpy as np

from kvchat.engine import AskSettings, KvLayout, PreparedPrompt
from kvchat.engine.kvcache.cache import SavedCells
from kvchat.engine.kvcache.foreground import Foreground, batch_stop
from kvchat.engine.reading.selected import Selected
from kvchat.errors import CancelledError, KvchatError
from kvchat.events import Done, Event, LaterReading, Progress, Stats, Token
from kvchat.llama import ModelShape, SamplerSettings, StateBytes
from kvchat.server.service import ChatService, ServerLimits
from kvchat.serving.requests import ChatRequest
from kvchat.serving.scheduler import Scheduler
from kvchat.serving.slots import Slot

END = 256  # the fake's end-of-generation token; 0-255 are bytes
WAIT_S = 10.0  # how long a test or a held fake waits for what must happen before it fails
_FOREGROUND_ROOT = Path(tempfile.mkdtemp(prefix="kvchat-test-foreground-"))  # the fakes' questions: no real home's

T = TypeVar("T")


class Log(Generic[T]):
    """A list appended to by the model thread and waited on by a test (no polling)."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._changed = threading.Condition()

    def append(self, item: T) -> None:
        with self._changed:
            self._items.append(item)
            self._changed.notify_all()

    def wait_for(self, condition: Callable[[list[T]], bool], timeout_s: float = WAIT_S) -> list[T]:
        """The items once `condition(items)` holds; AssertionError after `timeout_s`."""
        with self._changed:
            if not self._changed.wait_for(lambda: condition(self._items), timeout_s):
                raise AssertionError(f"not there after {timeout_s} s: {self._items}")
            return list(self._items)

    def wait_len(self, count: int) -> list[T]:
        return self.wait_for(lambda items: len(items) >= count)

    @property
    def items(self) -> list[T]:
        with self._changed:
            return list(self._items)


class Emitted(Log["Event | KvchatError"]):
    """A job's emit: what the scheduler sent the job; its reading's Progress apart, in `progress`."""

    def __init__(self) -> None:
        super().__init__()
        self.progress: Log[Progress] = Log()

    def __call__(self, item: Event | KvchatError) -> None:
        if isinstance(item, Progress):
            self.progress.append(item)
        else:
            self.append(item)

    def ended(self, timeout_s: float = WAIT_S) -> list[Event | KvchatError]:
        """Everything sent, once the last (a Done or an error) came."""
        return self.wait_for(lambda items: bool(items) and isinstance(items[-1], (Done, KvchatError)), timeout_s)

    @property
    def tokens(self) -> list[str]:
        return [item.text for item in self.items if isinstance(item, Token)]


@dataclass(frozen=True)
class Script:
    """What the fake does with one request."""

    answer: str = "ok"  # "" ends at once: the first token is END
    prompt_tokens: int = 100
    loaded_tokens: int = 0  # of the prompt, "loaded from a saved reading"
    kept_tokens: int = 40  # the last `kept_tokens` positions of the prompt
    chunks: int = 1  # Progress events while reading: the answers in progress get a decode step after each
    paced: bool = False  # each chunk waits for FakeReading.allow()
    until_cancelled: bool = False  # the reading waits before its first chunk until its job is cancelled
    error: Exception | None = None  # raised once the chunks are read, instead of returning a prompt
    unread: bool = False  # a fast reading answered: the document is then read whole (FakeEngine.read_whole)
    chunk_s: float = 0.0  # how long each chunk "takes" on the scheduler's clock (FakeEngine.clock)
    in_parts: bool = False  # answered in parts while read: a character of the answer after each chunk, no sequence


@dataclass
class FakeReading:
    """One preparation the scheduler ran. `outcome` is set once it ended: "prepared",
    "cancelled" or "failed"."""

    request: ChatRequest
    script: Script
    cancel: threading.Event  # the job's
    chunks_read: Log[int] = field(default_factory=Log)
    ended: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""
    _allowed: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def allow(self, chunks: int = 1) -> None:
        """Let a paced reading read `chunks` more chunks."""
        self._allowed.release(chunks)

    def wait_for_chunk(self, chunk: int) -> None:
        """Hold the reading as its script says, then stop it if its job was cancelled."""
        if self.script.until_cancelled and chunk == 0 and not self.cancel.wait(WAIT_S):
            raise AssertionError("the reading's job was never cancelled")
        if self.script.paced and not self._allowed.acquire(timeout=WAIT_S):
            raise AssertionError(f"chunk {chunk} of the reading was never allowed")
        if self.cancel.is_set():  # as a real reading: the cancel is seen between chunks
            raise CancelledError("stopped", "")


def _answered_in_parts(script: Script, said: int, stop_reason: str) -> Done:
    """An answer in parts of its script: its first `said` characters, one a part."""
    stats = Stats("fake", "full", 0, script.prompt_tokens, script.prompt_tokens, 0, said, 1, 1, 1.0, 1.0, 0.0, 0.0,
                  script.prompt_tokens, stop_reason, read=f"in {said} parts")
    return Done(script.answer[:said], stats, read_later=LaterReading.WHOLE if script.unread else None)


class FakeModel:
    """What the scheduler and the service ask of a model: tokens are UTF-8 bytes."""

    shape = ModelShape(n_layer=2, n_head=4, n_head_kv=2, head_dim=16, n_ctx_train=4096, n_vocab=END + 1)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return list(text.encode())

    def count_tokens(self, text: str) -> int:
        return len(text.encode())

    def piece(self, token: int, special: bool = False) -> bytes:
        return bytes([token])

    def is_end_of_generation(self, token: int) -> bool:
        return token == END


@dataclass(frozen=True)
class Step:
    """One decode step: token i was fed to sequence seqs[i] at positions[i]."""

    seqs: tuple[int, ...]
    tokens: tuple[int, ...]
    positions: tuple[int, ...]


@dataclass
class FakeContext:
    """The sampler reads row i of the last step from `handle`: sequence i's next scripted token."""

    handle: list[int] = field(default_factory=list)


class FakeDecoder:
    """SlotDecoder's bookkeeping without a context: each sequence answers with the rest of the
    answer its state holds. Steps can be held until the test allows them, and can fail."""

    def __init__(
        self, n_slots: int, slot_cells: int, layout: KvLayout, held: bool, failures: dict[int, Exception],
        engine: FakeEngine | None = None,
    ) -> None:
        self.slot_cells = slot_cells
        self.layout = layout
        self.slots = [Slot(seq) for seq in range(n_slots)]
        self.ctx = FakeContext()
        self.loads: Log[tuple[int, int]] = Log()  # (seq, cells)
        self.steps: Log[Step] = Log()
        self.releases: Log[int] = Log()  # seqs
        self.held_steps: Log[int] = Log()  # the number of each held step, once it waits to be allowed
        self.closed = False
        self._rest: dict[int, list[int]] = {}
        self._held = held
        self._allowed = threading.Semaphore(0)
        self._failures = failures  # step number (from 1, failed steps counted) -> what it raises
        self._tried = 0
        self._engine = engine  # whose clock a step moves by its step_s

    def allow(self, steps: int = 1) -> None:
        """Let `steps` more held steps happen."""
        self._allowed.release(steps)

    def run_free(self) -> None:
        """Hold no more steps."""
        self._held = False
        self._allowed.release()  # the step waiting now, if one is

    def free_slot(self) -> Slot | None:
        return next((slot for slot in self.slots if not slot.busy), None)

    def load(self, slot: Slot, state: StateBytes, positions: np.ndarray) -> None:
        self._rest[slot.seq] = [*bytes(state), END]
        slot.busy = True
        slot.cells, slot.next_pos = len(positions), int(positions[-1]) + 1
        self.loads.append((slot.seq, slot.cells))

    def room(self, slot: Slot) -> int:
        return self.slot_cells - slot.cells

    def step(self, slots: list[Slot], tokens: list[int]) -> None:
        if self._held:
            self.held_steps.append(self._tried + 1)
        if self._held and not self._allowed.acquire(timeout=WAIT_S):
            raise AssertionError("a held decode step was never allowed")
        self._tried += 1
        if failure := self._failures.get(self._tried):
            raise failure
        if self._engine is not None:
            self._engine.now += self._engine.step_s
        self.ctx.handle = [self._rest[slot.seq].pop(0) for slot in slots]
        self.steps.append(Step(tuple(s.seq for s in slots), tuple(tokens), tuple(s.next_pos for s in slots)))
        for slot in slots:
            slot.next_pos += 1
            slot.cells += 1

    def release(self, slot: Slot) -> None:
        self._rest.pop(slot.seq, None)
        slot.busy, slot.cells, slot.next_pos = False, 0, 0
        self.releases.append(slot.seq)

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeSampler:
    settings: SamplerSettings
    closed: bool = False

    def sample(self, handle: list[int], row: int = -1) -> int:
        return handle[row]

    def close(self) -> None:
        self.closed = True


class FakeEngine:
    """Stands for Engine under the scheduler and the service; builds both on the fakes above."""

    model_name = "fake"

    def __init__(
        self, scripts: dict[str, Script] | None = None, default: Script = Script(), held_steps: bool = False,
        step_failures: dict[int, Exception] | None = None, saves_readings: bool = False, whole_chunks: int = 3,
        step_s: float = 0.0, reads_fast: bool = False, foreground: Foreground | None = None,
    ) -> None:
        self.states = object() if saves_readings else None  # whole readings are only done where they are saved
        self.foreground = foreground or Foreground(_FOREGROUND_ROOT)  # the questions of every kvchat process
        self.reads_fast = reads_fast  # a question about a document being read is read fast (plan())
        self.asked_after_reading: list[int] = []  # how far the whole reading had got, each time plan() was asked
        self.whole_chunks = whole_chunks
        self.whole_allowed = threading.Semaphore(0)  # each chunk of a whole reading waits for a release
        self.stop_checks: list[Callable[[], bool] | None] = []  # what would stop each chunk of it part-way
        self.order: Log[str] = Log()  # "prepare Q", "whole Q 1 after 3 steps" … "whole Q closed", in order
        self.model = FakeModel()
        self.scripts = scripts or {}
        self.default = default
        self.readings: Log[FakeReading] = Log()
        self.samplers: list[FakeSampler] = []
        self.decoder: FakeDecoder | None = None
        self.closed = False
        self._held_steps = held_steps
        self._step_failures = step_failures or {}
        self.now = 0.0  # the scheduler's clock: it moves only as a script's chunks and the steps say
        self.step_s = step_s

    def later_reading(self, _n_document: int, settings: AskSettings) -> LaterReading | None:
        """Engine.later_reading's stand-in: a fake engine has a cheap pass (its questions read fast)."""
        return settings.later_reading

    def answer_sources(self, _prompt: PreparedPrompt, _answer_tokens: list[int]) -> tuple[tuple, tuple, None]:
        """Engine.answer_sources' stand-in: a fake prompt is about no document, so names no sources."""
        return (), (), None

    def scheduler(self, n_slots: int = 2, slot_cells: int = 512, max_waiting: int = 4, max_readings: int = 2) -> Scheduler:
        return self.new_scheduler(self, n_slots, slot_cells, max_waiting, None, KvLayout(), max_readings)

    def new_scheduler(
        self, engine: object, n_slots: int, slot_cells: int, max_waiting: int, threads: int | None, layout: KvLayout,
        max_readings: int,
    ) -> Scheduler:
        """ChatService's `new_scheduler`."""
        return Scheduler(engine, n_slots, slot_cells, max_waiting, threads, layout, max_readings, prepare=self.prepare,
                         new_decoder=self.new_decoder, new_sampler=self.new_sampler, read_later=self.read_whole,
                         clock=lambda: self.now)

    def service(self, **limits: object) -> ChatService:
        return ChatService(self, ServerLimits(model_id="kvchat-test", **limits), new_scheduler=self.new_scheduler)

    def new_decoder(self, _model: FakeModel, n_slots: int, slot_cells: int, _threads: int | None, layout: KvLayout) -> FakeDecoder:
        self.decoder = FakeDecoder(n_slots, slot_cells, layout, self._held_steps, self._step_failures, self)
        return self.decoder

    def new_sampler(self, settings: SamplerSettings) -> FakeSampler:
        self.samplers.append(FakeSampler(settings))
        return self.samplers[-1]

    def script_for(self, request: ChatRequest) -> Script:
        question = request.question if request.document is not None else request.messages[-1]["content"]
        return self.scripts.get(question, self.default)

    def prepare(self, _engine: object, request: ChatRequest, cancel: threading.Event, _sampler: FakeSampler) -> Iterator[Event]:
        """prepared.prepare's stand-in: the script's chunks, then its prompt (or its error)."""
        script = self.script_for(request)
        reading = FakeReading(request, script, cancel)
        self.readings.append(reading)
        self.order.append(f"prepare {request.question}")
        said = 0  # an answer in parts: its characters shown
        try:
            to_read = script.prompt_tokens - script.loaded_tokens
            for chunk in range(script.chunks):
                try:
                    reading.wait_for_chunk(chunk)
                except CancelledError:
                    if not said:
                        raise
                    reading.outcome = "stopped"  # as answer_in_parts: once some text was shown, it ends there
                    return _answered_in_parts(script, said, "cancelled")
                self.now += script.chunk_s
                reading.chunks_read.append(chunk + 1)
                yield Progress(script.loaded_tokens + to_read * (chunk + 1) // script.chunks, script.prompt_tokens, 0.0)
                if script.in_parts:
                    yield Token(script.answer[chunk])
                    said += 1
            if script.error is not None:
                raise script.error
        except CancelledError:
            reading.outcome = "cancelled"
            raise
        except Exception:
            reading.outcome = "failed"
            raise
        else:
            reading.outcome = "prepared"
        finally:
            reading.ended.set()
        if script.in_parts:
            return _answered_in_parts(script, script.chunks, "stop")
        answer = script.answer.encode()
        positions = np.arange(script.prompt_tokens - script.kept_tokens, script.prompt_tokens)
        selected = Selected(script.prompt_tokens, script.kept_tokens, script.loaded_tokens, 0.0, 0.0, time.perf_counter())
        kept = SavedCells(answer[1:], positions, np.zeros(len(positions), dtype=np.int64), positions)
        return PreparedPrompt(kept, answer[0] if answer else END, selected, request.settings, read_later=LaterReading.WHOLE if script.unread else None)

    def plan(self, _document: object, _settings: object) -> SimpleNamespace:
        """Engine.plan's stand-in: only whether a question reads fast before the rest of the reading."""
        def reads_fast_before_the_rest(read: int) -> bool:
            self.asked_after_reading.append(read)
            return self.reads_fast

        return SimpleNamespace(reads_fast_before_the_rest=reads_fast_before_the_rest)

    def read_whole(self, _engine: object, request: ChatRequest, _later: object) -> Iterator[Event]:
        """background_readings.read_later's stand-in: `whole_chunks` chunks, each once whole_allowed is
        released, logged in `order` with the decode steps done before it."""
        try:
            for chunk in range(1, self.whole_chunks + 1):
                if not self.whole_allowed.acquire(timeout=WAIT_S):
                    raise AssertionError(f"chunk {chunk} of the whole reading was never allowed")
                steps = 0 if self.decoder is None else len(self.decoder.steps.items)
                self.order.append(f"whole {request.question} {chunk} after {steps} steps")
                self.stop_checks.append(batch_stop(None))
                yield Progress(chunk, self.whole_chunks, 0.0)
        finally:
            self.order.append(f"whole {request.question} closed")

    def close(self) -> None:
        self.closed = True
