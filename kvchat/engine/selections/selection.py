"""What each answer of a conversation is chosen from, as small frozen objects like the methods.

A method (kvchat.policy) says which cells a question keeps; a selection says when that choice is
made and what it starts from: each question choosing anew from the whole document (`question`),
one choice per document made before any question (`document`), or the first question's choice
kept for the follow-ups (`reuse`). One class per file, one registry (registry.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.policy import Method

QuestionWindow = Callable[[str], list[int]]  # a question's tokens that observe (Conversation.question_window)


@dataclass(frozen=True)
class QuestionStart:
    """How a question selects, once its selection has set the cache."""

    pinned: int  # tokens after the cache's cells kept on top of the budget (the earlier turns)
    prunes: bool  # the question observes and prunes (False: the cache holds an earlier choice)


@dataclass(frozen=True)
class Selection:
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""  # what it does, in a few words (shown in --help)

    def after_reading(self, run: PromptRun, method: Method, question_window: QuestionWindow) -> None:
        """The document was read, loaded or streamed into `run`, and is its restore point; a
        choice made once per document (by `method`, observed by a question's window) is made here."""

    def before_question(self, run: PromptRun, tokens: list[int], n_earlier: int, last_prompt: list[int] | None) -> QuestionStart:
        """Set `run`'s cache the question's prompt `tokens` are answered from: the restore point,
        or what an earlier choice left. `n_earlier` = tokens of the earlier turns the prompt
        adds; `last_prompt`: the previous question's whole prompt (None for the first question)."""
        raise NotImplementedError
