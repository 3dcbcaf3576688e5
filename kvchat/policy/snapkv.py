"""SnapKV (Li et al., NeurIPS 2024): keep the positions the question's attention votes for.

The last `window` prompt tokens (the question) observe: each earlier position gets the attention
it received from them, pooled per head so neighbours of chosen tokens survive together, reduced
over heads and layers to one score (llama.cpp's cells are shared by all heads), and the top ones
under the budget are kept. With `heads="per-head"` there is no reduction: each layer and KV head
keeps its own top positions (the votes of its GQA group summed, as kvpress does), every pinned
one included, and the engine rewrites the cells to hold them (llama/composite.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvchat.errors import SettingsError
from kvchat.policy.method import Method
from kvchat.policy.plan import PrunePlan
from kvchat.policy.pooling import PoolMode, pool_scores
from kvchat.policy.scoring import HeadReduction, reduce_votes
from kvchat.policy.spans import SPAN_MODES, SpanMode


@dataclass(frozen=True)
class SnapKV(Method):
    """`budget` counts everything kept, the window included (SnapKV's max_capacity_prompt)."""

    name = "snapkv"
    summary = "prune after reading"
    scores = True

    kernel: int = 7
    pool: PoolMode = "max"
    heads: HeadReduction = HeadReduction.SUM
    spans: SpanMode = "words"
    # The share of the budget given to the passages the question's words choose (BM25), where the
    # question's attention chooses from a whole reading; 0: its attention chooses everything.
    words: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise SettingsError(f"kernel must be an odd number, got {self.kernel}", "use an odd kernel such as 7")
        if self.pool not in ("max", "avg"):
            raise SettingsError(f"pool must be max or avg, got {self.pool!r}", "use max (the default) or avg")
        if self.spans not in SPAN_MODES:
            raise SettingsError(f"spans must be one of {', '.join(SPAN_MODES)}, got {self.spans!r}",
                                "use words (the default), sentences, chunks or none")
        if not 0 <= self.words <= 1:
            raise SettingsError(f"words is a share of the budget, from 0 to 1, got {self.words}",
                                "use words=0 (attention chooses all) or a share such as 0.25")

    @property
    def span_mode(self) -> SpanMode:
        return self.spans

    @property
    def word_tokens(self) -> int:
        return min(int(self.words * self.budget), self.budget - self.window - self.sinks)

    @property
    def per_head(self) -> bool:
        return self.heads == HeadReduction.PER_HEAD

    def plan(
        self,
        n_tokens: int,
        window: int,
        votes: np.ndarray | None = None,
        span_ids: np.ndarray | None = None,
        extra_pins: np.ndarray | None = None,
        first: np.ndarray | None = None,
    ) -> PrunePlan:
        if votes is None:
            raise ValueError("SnapKV plans from votes")
        extra = np.zeros(n_tokens, dtype=bool) if extra_pins is None else extra_pins.astype(bool)
        pinned = self.pinned_mask(n_tokens, window)
        if int((~(pinned | extra)).sum()) <= self.budget - int(pinned.sum()):
            return PrunePlan(n_tokens=n_tokens, kept=np.arange(n_tokens))
        capacity = self.budget - int(pinned.sum())
        if first is not None:  # within the budget, before the votes: as many as it has room for
            taken = np.flatnonzero(first.astype(bool) & ~pinned & ~extra)[:capacity]
            pinned[taken] = True
            capacity -= len(taken)
        pinned |= extra
        pooled = pool_scores(votes, self.kernel, self.pool)
        spans = span_ids if self.needs_spans else None
        if self.per_head:
            return PrunePlan.per_head(n_tokens, _keep_per_head(pooled, pinned, capacity, spans))
        return PrunePlan.from_mask(_keep(reduce_votes(pooled, ~pinned, self.heads, capacity), pinned, capacity, spans))


def _keep(scores: np.ndarray, pinned: np.ndarray, capacity: int, span_ids: np.ndarray | None) -> np.ndarray:
    """The pinned positions and the best `capacity` others, whole spans first when given."""
    if span_ids is not None:
        return _keep_spans(scores, pinned, capacity, span_ids)
    return _keep_top(scores, pinned, capacity)


def _keep_per_head(pooled: np.ndarray, pinned: np.ndarray, capacity: int, span_ids: np.ndarray | None) -> np.ndarray:
    """(n_layer, n_head_kv, pinned + capacity) sorted positions: each head's own choice."""
    n_layer, n_head = pooled.shape[:2]
    kept = np.empty((n_layer, n_head, int(pinned.sum()) + capacity), dtype=np.int64)
    for layer in range(n_layer):
        for head in range(n_head):
            scores = np.where(pinned, -np.inf, pooled[layer, head].astype(np.float64))
            kept[layer, head] = np.flatnonzero(_keep(scores, pinned, capacity, span_ids))
    return kept


def _keep_top(scores: np.ndarray, pinned: np.ndarray, capacity: int) -> np.ndarray:
    keep = pinned.copy()
    top = np.argpartition(-scores, capacity - 1)[:capacity]
    keep[top] = True
    return keep


def _keep_spans(
    scores: np.ndarray, pinned: np.ndarray, capacity: int, span_ids: np.ndarray
) -> np.ndarray:
    """Greedy by score: take a winner's whole span if it still fits, then fill to the budget."""
    keep = pinned.copy()
    span_starts = np.searchsorted(span_ids, span_ids, side="left")
    span_ends = np.searchsorted(span_ids, span_ids, side="right")
    order = np.argsort(-scores, kind="stable")
    remaining = capacity
    for position in order:
        if remaining == 0 or not np.isfinite(scores[position]):
            break
        if keep[position]:
            continue
        members = np.arange(span_starts[position], span_ends[position])
        members = members[~keep[members]]
        if len(members) <= remaining:
            keep[members] = True
            remaining -= len(members)
    if remaining > 0:
        scores_left = np.where(keep, -np.inf, scores)
        keep[np.argpartition(-scores_left, remaining - 1)[:remaining]] = True
    return keep
