"""What a selection leaves for the answer: shared by the engine's answers and the server's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Selected:
    """What select() leaves for answer(): the prompt, the cells kept of it, and the time the
    answer's first token waits for (the reading counted into it, then the selection's own)."""

    n_prompt: int
    kept: int
    loaded_tokens: int  # of the prompt, taken from a saved state; the rest were read (decoded)
    reading_s: float
    window_s: float
    started: float  # when the selection began
    read: str = "full"  # how: "full", "fast 12/24 layers" (a cheap pass through 12 of 24 layers chose), "draft small, 12/24 layers, 4,096 re-read"
