"""One query-agnostic choice per document, reused for every question."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvchat.engine.prompt import GENERIC_QUESTION
from kvchat.engine.selections.question import PerQuestion
from kvchat.engine.selections.selection import QuestionStart

if TYPE_CHECKING:
    from kvchat.engine.conversation import Conversation


@dataclass(frozen=True)
class PerDocument(PerQuestion):
    """A generic question observes once the document is read; the kept cells become the restore
    point every question starts from, without selecting again. Less work per turn; weaker on
    details the generic question did not look for."""

    name = "document"
    summary = "one query-agnostic selection per document"

    def after_reading(self, conversation: Conversation) -> None:
        cache = conversation.run.cache
        votes = cache.observe(conversation.question_window(GENERIC_QUESTION), keep=False)
        # the document's last token stands in the window
        cache.apply(cache.plan(conversation.settings.method, 1, votes))
        conversation.run.save()

    def before_question(self, conversation: Conversation, tokens: list[int], n_earlier: int) -> QuestionStart:
        conversation.run.restore()
        return QuestionStart(pinned=0, prunes=False)
