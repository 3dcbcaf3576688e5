"""The full cache: every prompt position is kept (the baseline every method is measured against)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvchat.policy.method import Method
from kvchat.policy.plan import PrunePlan


@dataclass(frozen=True)
class Full(Method):
    name = "full"
    summary = "keep everything"

    def plan(
        self,
        n_tokens: int,
        window: int,
        votes: np.ndarray | None = None,
        span_ids: np.ndarray | None = None,
        extra_pins: np.ndarray | None = None,
        first: np.ndarray | None = None,
    ) -> PrunePlan:
        return PrunePlan(n_tokens=n_tokens, kept=np.arange(n_tokens))
