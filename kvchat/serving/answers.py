"""The answers in progress on the shared context (slots.py): each holds a sequence, and every
decode step feeds one token of each to one llama_decode (continuous batching). The scheduler
(scheduler.py) decides when they step; this is how they start, step and end."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvchat.engine import Engine, Generation, PreparedPrompt, answer_stats
from kvchat.errors import InternalError, KvchatError, PromptTooLongError
from kvchat.events import Done, Token
from kvchat.llama import Sampler
from kvchat.serving.jobs import ChatJob
from kvchat.serving.slots import Slot, SlotDecoder

LOGGER = logging.getLogger(__name__)


@dataclass
class _Answer:
    job: ChatJob
    slot: Slot
    prompt: PreparedPrompt
    sampler: Sampler
    generation: Generation
    next_token: int
    used_s: float = 0.0  # the time its reading and its steps took so far


class AnswersInProgress:
    """The answers being decoded, in the order they started. `stopping` says whether the server
    is shutting down (each answer then ends as "cancelled" at its next token); `clock` is what
    each answer's share of time is counted by (the scheduler's)."""

    def __init__(self, engine: Engine, decoder: SlotDecoder, stopping: Callable[[], bool], clock: Callable[[], float]) -> None:
        self.engine = engine
        self.decoder = decoder
        self._stopping = stopping
        self._clock = clock
        self._answers: list[_Answer] = []

    def __len__(self) -> int:
        return len(self._answers)

    def least_used_s(self) -> float:
        """The least time any answer in progress has taken so far (there is one)."""
        return min(answer.used_s for answer in self._answers)

    def start(self, job: ChatJob, prepared: PreparedPrompt, sampler: Sampler, used_s: float) -> None:
        """Move a prepared prompt into a free sequence and take its first token. Raises
        PromptTooLongError where its kept prompt outgrows a sequence, or what llama.cpp's load
        raised (the sequence is freed again); the caller then ends the job."""
        if len(prepared.kept.positions) + 1 > self.decoder.slot_cells:
            raise PromptTooLongError(
                f"the kept prompt is {len(prepared.kept.positions):,} tokens; a sequence holds {self.decoder.slot_cells:,}",
                "use kv_method snapkv with a smaller kv_budget, or a shorter conversation",
            )
        slot = self.decoder.free_slot()
        assert slot is not None  # only the model thread takes slots, and each reading has one reserved
        try:
            self.decoder.load(slot, prepared.kept.state, prepared.kept.positions)
        except Exception:
            self.decoder.release(slot)
            raise
        generation = Generation(self.engine.model, job.request.settings.max_tokens)
        answer = _Answer(job, slot, prepared, sampler, generation, prepared.first_token, used_s)
        self._answers.append(answer)
        self._advance(answer, prepared.first_token)

    def step(self) -> None:
        """One decode step for every answer in progress, then sample each one's next token."""
        answers = list(self._answers)
        started, clock_started = time.perf_counter(), self._clock()
        try:
            self.decoder.step([a.slot for a in answers], [a.next_token for a in answers])
        except Exception as error:  # the answers in progress fail; the server goes on
            LOGGER.exception("a decode step failed")
            return self._fail_all(InternalError(f"decoding failed: {error}", "see the server's log file"))
        elapsed, used = time.perf_counter() - started, self._clock() - clock_started  # the step's speed; its share of time
        for row, answer in enumerate(answers):
            answer.generation.count_step(elapsed)
            answer.used_s += used
            self._advance(answer, answer.sampler.sample(self.decoder.ctx.handle, row))

    def cancel_all(self) -> None:
        """End every answer as "cancelled", with what it said so far (the server stops)."""
        for answer in list(self._answers):
            answer.job.cancel.set()
            answer.generation.stop("cancelled")
            self._finish(answer)

    def _advance(self, answer: _Answer, token: int) -> None:
        """The answer takes its next token (the engine's Generation decides what ends it)."""
        generation = answer.generation
        if text := generation.add(token):
            answer.job.emit(Token(text))
        if not generation.over and (answer.job.cancel.is_set() or self._stopping()):
            generation.stop("cancelled")
        if not generation.over and self.decoder.room(answer.slot) < 1:
            generation.stop("max_tokens")
        if generation.over:
            return self._finish(answer)
        answer.next_token = token

    def _finish(self, answer: _Answer) -> None:
        generation = answer.generation
        if tail := generation.flush():
            answer.job.emit(Token(tail))
        answer.sampler.close()
        settings, prompt = answer.prompt.settings, answer.prompt.selected
        stats = answer_stats(  # before the release: it counts the sequence's cells
            self.engine.model, self.engine.model_name, settings, prompt, generation, answer.job.submitted, answer.slot.cells
        )
        self.decoder.release(answer.slot)
        self._answers.remove(answer)
        sources, attention, notice = ((), (), None) if generation.stop_reason == "cancelled" else (
            self.engine.answer_sources(answer.prompt, generation.token_ids))
        if notice is not None:  # the answer stands without them (from_kept.sources_or_notice)
            answer.job.emit(notice)
        answer.job.emit(Done(generation.text, stats, sources, attention))

    def _fail_all(self, error: KvchatError) -> None:
        for answer in list(self._answers):
            answer.sampler.close()
            self.decoder.release(answer.slot)
            self._answers.remove(answer)
            answer.job.emit(error)
