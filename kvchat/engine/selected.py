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
    read_layers: int = 0  # a fast reading: the layers its cheap pass read the prompt with (0: a full reading)
