"""Streamed reading (SnapStream): read a document of any length within a fixed budget.

The document is read chunk by chunk. Whenever the cache holds more than the budget, an
observation window scores every cell and the cache is cut back to the budget: attention sinks,
the highest-scoring entries and a ring of the most recent tokens survive, then it is compacted.
`streamingllm` keeps only the sinks and the newest tokens (the classic baseline, no scores).
Query-aware (the default when the question is known): the question is decoded as a temporary
window after the chunk, its attention read, and removed again. Query-agnostic: the chunk's own
last tokens observe. Each eviction re-scores every cell with the fresh window (see
`StreamSettings.carry` for carrying old votes along); positions are repacked with seq_add
before they would pass the model's trained context.

Evictions while reading rank cells for all heads at once, even with `--heads per-head`: a repack
shifts a cell's heads alike, by the cell's position, and a cell kept per head holds tokens of
different positions in its heads, so the relative positions of a per-head reading would drift
with every repack (and the carried votes are per cell). The selection the question makes once the
reading is done is per head as asked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import replace

import numpy as np

from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.settings import AskSettings
from kvchat.errors import SettingsError, raise_if_cancelled
from kvchat.events import Event, Evicted, Progress
from kvchat.llama import LlamaModel
from kvchat.policy import HeadReduction


def stream_context_size(settings: AskSettings, n_question: int, n_ctx_train: int) -> int:
    """budget + chunk + the question (or observer) + the answer's share; never the document.

    Longer answers run on the decode ring; the whole stays within the trained context.
    """
    reading = settings.method.budget + settings.stream.chunk + max(n_question, settings.method.window) + 64
    if reading + 64 > n_ctx_train:
        raise SettingsError(
            f"budget {settings.method.budget} + chunk {settings.stream.chunk} do not fit the model's {n_ctx_train} positions",
            "lower `budget` or `chunk`",
        )
    if settings.n_ctx is not None:
        if settings.n_ctx < reading + 64:
            raise SettingsError(
                f"`n_ctx` {settings.n_ctx} is smaller than what streamed reading needs ({reading + 64})",
                "raise `n_ctx`, or lower `budget` or `chunk`",
            )
        return settings.n_ctx
    return reading + min(settings.max_tokens, 1024, n_ctx_train - reading)


class _Scorer:
    """Votes per cell, optionally carrying a decayed share of each survivor's earlier votes."""

    def __init__(self, carry: float) -> None:
        self.carry = carry
        self.carried: np.ndarray | None = None

    def combine(self, votes: np.ndarray) -> np.ndarray:
        if self.carry and self.carried is not None:
            votes = votes.copy()
            votes[..., : self.carried.shape[-1]] += self.carry * self.carried
        return votes

    def keep(self, votes: np.ndarray, kept: np.ndarray) -> None:
        self.carried = votes[..., kept] if self.carry else None


def stream_read(
    cache: KvCache,
    model: LlamaModel,
    tokens: list[int],
    start: int,
    question_window: list[int] | None,
    settings: AskSettings,
    cancel: threading.Event | None = None,
) -> Generator[Event, None, None]:
    """Read tokens[start:] into `cache` within budget + chunk cells (+ the temporary observer);
    each Progress says how far the reading got (PromptRun.stream keeps count)."""
    total, method, read_upto, stream = len(tokens), settings.method, start, settings.stream
    recency_only = not method.scores  # StreamingLLM: evict by position, no observation
    if method.per_head:  # see the module's docstring
        method = replace(method, heads=HeadReduction.SUM)
    # the recent ring takes at most half of what the budget leaves after the sinks
    recent = min(stream.recent, (method.budget - method.sinks) // 2)
    scorer = _Scorer(stream.carry)
    # leave positions for what follows the reading: the question and the answer's share
    position_room = model.shape.n_ctx_train - (cache.ctx.n_ctx - method.budget - stream.chunk)
    reading_s, resumed = 0.0, time.perf_counter()  # the time between its events: not while its consumer holds one
    while read_upto < total:
        raise_if_cancelled(cancel)
        chunk = tokens[read_upto : read_upto + stream.chunk]
        if cache.next_pos + len(chunk) > position_room:
            cache.repack()
        more_to_read = read_upto + len(chunk) < total
        over_budget = cache.cells + len(chunk) > method.budget and (more_to_read or recency_only)
        observer = chunk[-method.window :] if over_budget and not (question_window or recency_only) else []
        cache.decode(chunk[: len(chunk) - len(observer)])
        votes = cache.observe(observer) if observer else None
        read_upto += len(chunk)
        reading_s += time.perf_counter() - resumed
        yield Progress(done=read_upto, total=total, elapsed_s=reading_s, read_from=start)
        resumed = time.perf_counter()
        if over_budget:
            if recency_only:
                kept = cache.plan(method, recent, None).kept
            else:
                if question_window:
                    votes = cache.observe(question_window, keep=False)
                votes = scorer.combine(votes)
                kept = cache.plan(method, recent, votes).kept
                scorer.keep(votes, kept)
            dropped = cache.keep_cells(kept)
            reading_s += time.perf_counter() - resumed
            yield Evicted(count=len(dropped), positions=tuple(int(p) for p in dropped))
            resumed = time.perf_counter()
