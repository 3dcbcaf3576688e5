"""SnapKV selection: which prompt positions keep their KV entries."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvchat.errors import SettingsError
from kvchat.policy.plan import PrunePlan
from kvchat.policy.pooling import PoolMode, pool_scores
from kvchat.policy.scoring import HeadReduction, reduce_votes


@dataclass(frozen=True)
class SnapKV:
    """Keep `budget` prompt positions: pins (sinks + observation window) plus the top-scored rest.

    `budget` counts everything kept, the window included (SnapKV's max_capacity_prompt). The CLI,
    the TUI and the server all build one, so its errors name settings, not one front end's flags.
    """

    budget: int = 1024
    window: int = 32
    kernel: int = 7
    pool: PoolMode = "max"
    sinks: int = 4
    heads: HeadReduction = HeadReduction.SUM
    spans: bool = True

    def __post_init__(self) -> None:
        if self.window < 1:
            raise SettingsError(f"window must be at least 1, got {self.window}", "use a window of at least 1 (32 is the default)")
        if self.budget < self.window + self.sinks:
            raise SettingsError(
                f"budget {self.budget} is smaller than window {self.window} + {self.sinks} sinks",
                f"use a budget of at least {self.window + self.sinks}, or a smaller window",
            )
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise SettingsError(f"kernel must be an odd number, got {self.kernel}", "use an odd kernel such as 7")
        if self.pool not in ("max", "avg"):
            raise SettingsError(f"pool must be max or avg, got {self.pool!r}", "use max (the default) or avg")

    def pinned_mask(self, n_tokens: int) -> np.ndarray:
        """Positions always kept within the budget: the first `sinks` and the last `window`."""
        pinned = np.zeros(n_tokens, dtype=bool)
        pinned[: self.sinks] = True
        pinned[max(0, n_tokens - self.window) :] = True
        return pinned

    def plan(
        self,
        votes: np.ndarray,
        span_ids: np.ndarray | None = None,
        extra_pins: np.ndarray | None = None,
    ) -> PrunePlan:
        """Plan from votes (n_layers, n_heads, n_tokens): window attention summed over queries.

        `extra_pins` (a conversation's earlier turns) are kept on top of the budget: the budget
        bounds what is chosen from the document, the conversation itself is never pruned.
        """
        n_tokens = votes.shape[-1]
        extra = np.zeros(n_tokens, dtype=bool) if extra_pins is None else extra_pins.astype(bool)
        pinned = self.pinned_mask(n_tokens)
        if int((~(pinned | extra)).sum()) <= self.budget - int(pinned.sum()):
            return PrunePlan(n_tokens=n_tokens, kept=np.arange(n_tokens))
        capacity = self.budget - int(pinned.sum())
        pinned |= extra
        pooled = pool_scores(votes, self.kernel, self.pool)
        scores = reduce_votes(pooled, ~pinned, self.heads, capacity)
        if self.spans and span_ids is not None:
            keep = _keep_spans(scores, pinned, capacity, span_ids)
        else:
            keep = _keep_top(scores, pinned, capacity)
        return PrunePlan.from_mask(keep)


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
