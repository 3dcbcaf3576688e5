"""One query-agnostic choice per document, reused for every question."""

from __future__ import annotations

from dataclasses import dataclass

from kvchat.engine.prompt import GENERIC_QUESTION
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.selections.question import PerQuestion
from kvchat.engine.selections.selection import QuestionStart, QuestionWindow
from kvchat.policy import Method


@dataclass(frozen=True)
class PerDocument(PerQuestion):
    """A generic question observes once the document is read; the kept cells become the restore
    point every question starts from, without selecting again. Less work per turn; weaker on
    details the generic question did not look for."""

    name = "document"
    summary = "one query-agnostic selection per document"

    def after_reading(self, run: PromptRun, method: Method, question_window: QuestionWindow) -> None:
        run.keep_once(question_window(GENERIC_QUESTION), method)

    def before_question(self, run: PromptRun, tokens: list[int], n_earlier: int, last_prompt: list[int] | None) -> QuestionStart:
        run.restore()
        return QuestionStart(pinned=0, prunes=False)
