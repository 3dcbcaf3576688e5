"""Small steps shared by reading, pruning and streaming: cancellation, progress, selection."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np

from kvchat.engine.cache import KvCache
from kvchat.errors import CancelledError
from kvchat.events import Progress
from kvchat.llama import LlamaModel
from kvchat.policy import Method, PrunePlan, spans_from_pieces


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise CancelledError("stopped", "")


def prefill(
    cache: KvCache, tokens: list[int], done: int, total: int, cancel: threading.Event | None = None
) -> Iterator[Progress]:
    """Decode `tokens` in batches, yielding progress: `done` of `total` prompt tokens before."""
    started = time.perf_counter()
    step = cache.ctx.settings.n_batch
    for offset in range(0, len(tokens), step):
        check_cancel(cancel)
        batch = tokens[offset : offset + step]
        cache.decode(batch)
        yield Progress(done=done + offset + len(batch), total=total, elapsed_s=time.perf_counter() - started)


def plan_cells(
    model: LlamaModel,
    method: Method,
    window: int,
    votes: np.ndarray | None,
    cache: KvCache,
    pinned: tuple[int, int] | None = None,
) -> PrunePlan:
    """Which of the cache's cells to keep; the last `window` observed and cast `votes` (None for a
    method that does not score). `pinned` = a [start, end) range of cells kept on top of the
    budget (a conversation's earlier turns)."""
    n_cells = cache.cells if votes is None else votes.shape[-1]
    span_ids = None
    if votes is not None and method.needs_spans:
        span_ids = spans_from_pieces(model.pieces_text([int(t) for t in cache.tokens[:n_cells]]))
    extra = None
    if pinned is not None and pinned[1] > pinned[0]:
        extra = np.zeros(n_cells, dtype=bool)
        extra[pinned[0] : pinned[1]] = True
    return method.plan(n_cells, window, votes, span_ids=span_ids, extra_pins=extra)
