"""What every method is: a small frozen object that says which prompt positions keep their KV
entries, in the spirit of kvpress's presses. One class per file (snapkv.py, snapstream.py,
streaming_llm.py, full.py), one registry (registry.py) that the CLI, the TUI, the bench and the
server build methods from.

The engine asks two things of a method: how it reads (`streams`: within the budget, chunk by
chunk, or the whole prompt first) and, when the cache holds more than the budget, `plan()`: which
cells to keep. A method that `scores` is given the observation window's votes for that; the window
actually observing is an argument, since it is shorter than `window` for a short question, the
recent ring while streaming, and one token for a query-agnostic selection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from kvchat.errors import SettingsError
from kvchat.policy.plan import PrunePlan
from kvchat.policy.spans import SpanMode

DEFAULT_BUDGET = 1024
DEFAULT_WINDOW = 32
DEFAULT_SINKS = 4
MIN_BUDGET = 16  # the least any front end keeps: the sinks, a window of 8 (window_for) and 4 chosen
MIN_WINDOW_ROOM = 8  # what a small budget keeps besides its window: the sinks and some chosen


def window_for(budget: int, window: int = DEFAULT_WINDOW) -> int:
    """The observation window `budget` has room for: `window`, shorter for a small budget."""
    return max(1, min(window, budget - MIN_WINDOW_ROOM))


@dataclass(frozen=True)
class Method:
    """Keep `budget` prompt positions (the observation window and `sinks` first ones included)."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""  # what it does, in a few words (shown in --help)
    streams: ClassVar[bool] = False  # reads the document within the budget, evicting as it goes
    scores: ClassVar[bool] = False  # chooses by the votes of the observation window's attention

    budget: int = DEFAULT_BUDGET
    window: int = DEFAULT_WINDOW
    sinks: int = DEFAULT_SINKS

    def __post_init__(self) -> None:
        if self.budget < MIN_BUDGET:
            raise SettingsError(f"budget must be at least {MIN_BUDGET}, got {self.budget}",
                                f"use a budget of {MIN_BUDGET} or more ({DEFAULT_BUDGET} is the default)")
        if self.window < 1:
            raise SettingsError(f"window must be at least 1, got {self.window}", f"use a window of at least 1 ({DEFAULT_WINDOW} is the default)")
        if self.budget < self.window + self.sinks:
            raise SettingsError(
                f"budget {self.budget} is smaller than window {self.window} + {self.sinks} sinks",
                f"use a budget of at least {self.window + self.sinks}, or a smaller window",
            )

    @property
    def prunes(self) -> bool:
        """Whether a prompt over the budget is cut back to it (not so for the full cache)."""
        return self.streams or self.scores

    @property
    def per_head(self) -> bool:
        """Whether plan() chooses per layer and KV head (its votes then come summed per KV head)."""
        return False

    @property
    def span_mode(self) -> SpanMode:
        """How plan() wants the tokens grouped (`span_ids`): not at all, into words, into sentences."""
        return "none"

    @property
    def word_tokens(self) -> int:
        """Tokens of the budget kept for the passages the question's words choose, before the
        votes choose the rest (plan()'s `first`): none unless a method that scores says so."""
        return 0

    @property
    def needs_spans(self) -> bool:
        return self.span_mode != "none"

    def pinned_mask(self, n_tokens: int, window: int) -> np.ndarray:
        """Positions always kept within the budget: the first `sinks` and the last `window`."""
        pinned = np.zeros(n_tokens, dtype=bool)
        pinned[: self.sinks] = True
        pinned[max(0, n_tokens - window) :] = True
        return pinned

    def plan(
        self,
        n_tokens: int,
        window: int,
        votes: np.ndarray | None = None,
        span_ids: np.ndarray | None = None,
        extra_pins: np.ndarray | None = None,
        first: np.ndarray | None = None,
    ) -> PrunePlan:
        """Which of `n_tokens` positions to keep; the last `window` observed. `votes`
        (n_layers, n_heads, n_tokens) is given to methods that score (per KV head for a per-head
        method, per query head otherwise); `span_ids` groups tokens
        of one span (see span_mode); `extra_pins` (a conversation's earlier turns) are kept on top of
        the budget: the budget bounds what is chosen from the document, never the conversation.
        `first` (the passages the question's words choose) are kept within the budget before the
        votes choose the rest; a method that does not score ignores them."""
        raise NotImplementedError
