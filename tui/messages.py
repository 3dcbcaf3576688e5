"""Messages that worker threads post to the chat app (post_message is thread-safe)."""

from __future__ import annotations

from typing import Literal

from textual.message import Message

from kvchat.documents import Document
from kvchat.events import Event

Job = Literal["reading", "answering"]
Outcome = Literal["done", "cancelled", "error"]


class EngineEvent(Message):
    """One event of the engine's stream (Progress, Notice, Pruned, Token, Done …)."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class PagesRead(Message):
    """OCR of a scanned PDF: `done` of `total` pages without a text layer are read."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__()
        self.done = done
        self.total = total


class DocumentLoaded(Message):
    """The document's text is loaded (its reading follows)."""

    def __init__(self, document: Document) -> None:
        super().__init__()
        self.document = document


class JobEnded(Message):
    """A reading or an answer finished, was stopped, or failed (`error`: one line with a hint)."""

    def __init__(self, job: Job, outcome: Outcome, error: str = "", session: object | None = None) -> None:
        super().__init__()
        self.job = job
        self.outcome = outcome
        self.error = error
        self.session = session
