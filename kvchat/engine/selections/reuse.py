"""The first question's choice kept for the follow-ups, as a plain chat would."""

from __future__ import annotations

from dataclasses import dataclass

from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.selections.question import PerQuestion
from kvchat.engine.selections.selection import QuestionStart


@dataclass(frozen=True)
class Reuse(PerQuestion):
    """The first question selects; each follow-up continues on the cache the last answer left
    (its kept prompt, less the answer and whatever of the prompt changed). The baseline the
    other selections are measured against."""

    name = "reuse"
    summary = "keep the first question's selection for the follow-ups"

    def before_question(self, run: PromptRun, tokens: list[int], n_earlier: int, last_prompt: list[int] | None) -> QuestionStart:
        if last_prompt is None:
            return super().before_question(run, tokens, n_earlier, last_prompt)
        run.keep_prefix(tokens, last_prompt)
        return QuestionStart(pinned=0, prunes=False)
