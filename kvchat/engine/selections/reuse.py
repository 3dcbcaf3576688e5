"""The first question's choice kept for the follow-ups, as a plain chat would."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvchat.engine.selections.question import PerQuestion
from kvchat.engine.selections.selection import QuestionStart

if TYPE_CHECKING:
    from kvchat.engine.conversation import Conversation


@dataclass(frozen=True)
class Reuse(PerQuestion):
    """The first question selects; each follow-up continues on the cache the last answer left
    (its kept prompt, less the answer and whatever of the prompt changed). The baseline the
    other selections are measured against."""

    name = "reuse"
    summary = "keep the first question's selection for the follow-ups"

    def before_question(self, conversation: Conversation, tokens: list[int], n_earlier: int) -> QuestionStart:
        if not conversation.turns:
            return super().before_question(conversation, tokens, n_earlier)
        conversation.run.keep_prefix(tokens, conversation.prompt_tokens)
        return QuestionStart(pinned=0, prunes=False)
