"""StreamingLLM (Xiao et al., ICLR 2024): the attention sinks and the most recent tokens, no scores.

Read within the budget: whenever the cache would pass it, the oldest entries after the sinks go.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvchat.policy.method import Method
from kvchat.policy.plan import PrunePlan


@dataclass(frozen=True)
class StreamingLLM(Method):
    name = "streamingllm"
    summary = "sinks + recent only"
    streams = True

    def plan(
        self,
        n_tokens: int,
        window: int,
        votes: np.ndarray | None = None,
        span_ids: np.ndarray | None = None,
        extra_pins: np.ndarray | None = None,
        first: np.ndarray | None = None,
    ) -> PrunePlan:
        keep = np.zeros(n_tokens, dtype=bool)
        keep[: self.sinks] = True
        if extra_pins is not None:
            keep |= extra_pins.astype(bool)
        newest = np.flatnonzero(~keep)[::-1][: max(self.budget - self.sinks, 0)]
        keep[newest] = True
        return PrunePlan.from_mask(keep)
