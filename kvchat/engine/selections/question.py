"""Every question chooses anew from the whole document (the default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvchat.engine.selections.selection import QuestionStart, Selection

if TYPE_CHECKING:
    from kvchat.engine.conversation import Conversation


@dataclass(frozen=True)
class PerQuestion(Selection):
    """The saved full reading is restored, the earlier turns pinned, the new question observes.
    Right for follow-ups about other parts of the document: a kept set serves one question."""

    name = "question"
    summary = "select for each question from the whole document"

    def before_question(self, conversation: Conversation, tokens: list[int], n_earlier: int) -> QuestionStart:
        conversation.run.restore()
        return QuestionStart(pinned=n_earlier, prunes=True)
