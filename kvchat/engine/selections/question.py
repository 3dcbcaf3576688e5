"""Every question chooses anew from the whole document (the default)."""

from __future__ import annotations

from dataclasses import dataclass

from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.selections.selection import QuestionStart, Selection


@dataclass(frozen=True)
class PerQuestion(Selection):
    """The saved full reading is restored, the earlier turns pinned, the new question observes.
    Right for follow-ups about other parts of the document: a kept set serves one question."""

    name = "question"
    summary = "select for each question from the whole document"

    def before_question(self, run: PromptRun, tokens: list[int], n_earlier: int, last_prompt: list[int] | None) -> QuestionStart:
        run.restore()
        return QuestionStart(pinned=n_earlier, prunes=True)
