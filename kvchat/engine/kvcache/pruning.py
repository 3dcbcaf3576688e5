"""Which cells a method keeps: the votes grouped as the method wants them (per KV head, into
words or sentences) and the method's plan (policy/), for KvCache.plan(), which keeps them."""

from __future__ import annotations

import numpy as np

from kvchat.llama import LlamaModel
from kvchat.policy import Method, PrunePlan, spans_from_pieces


def plan_cells(
    model: LlamaModel, tokens: np.ndarray, n_cells: int, method: Method, window: int, votes: np.ndarray | None,
    pinned: tuple[int, int] | None = None, first: np.ndarray | None = None,
) -> PrunePlan:
    """Which of `n_cells` cells (holding `tokens`) `method` keeps; the last `window` cells observed
    and cast `votes` (None for a method that does not score). `pinned` = a [start, end) range of
    cells kept on top of the budget (a conversation's earlier turns); `first` marks the cells kept
    within it before the votes choose (Method.plan)."""
    span_ids = None
    if votes is not None and method.per_head:  # the votes of each KV head's query heads, summed
        votes = votes.reshape(len(votes), model.shape.n_head_kv, -1, n_cells).sum(axis=2)
    if votes is not None and method.needs_spans:
        pieces = model.pieces_text([int(t) for t in tokens[:n_cells]])
        span_ids = spans_from_pieces(pieces, method.span_mode)
    extra = None
    if pinned is not None and pinned[1] > pinned[0]:
        extra = np.zeros(n_cells, dtype=bool)
        extra[pinned[0] : pinned[1]] = True
    return method.plan(n_cells, window, votes, span_ids=span_ids, extra_pins=extra, first=first)
