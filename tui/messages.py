"""Messages that worker threads post to the chat app (post_message is thread-safe)."""

from __future__ import annotations

import logging
from typing import Literal

from textual.message import Message

from kvchat.documents import Document
from kvchat.engine import form_label, setting_names
from kvchat.errors import CancelledError, KvchatError
from kvchat.events import Event

LOGGER = logging.getLogger(__name__)

Job = Literal["reading", "answering", "reading on"]  # reading on: the document for the follow-ups (Conversation.read_on)
Outcome = Literal["done", "cancelled", "error"]


class EngineEvent(Message):
    """One event of the engine's stream (Progress, Notice, Pruned, Token, Done …); `background`:
    of the whole document's reading after a fast answer."""

    def __init__(self, event: Event, background: bool = False) -> None:
        super().__init__()
        self.event = event
        self.background = background


class PausedElsewhere(Message):
    """The background reading waits (`waits`) while another kvchat process answers a question, or
    goes on after it."""

    def __init__(self, waits: bool) -> None:
        super().__init__()
        self.waits = waits


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

    @classmethod
    def of_error(cls, job: Job, error: BaseException) -> JobEnded:
        """How `job` ended when `error` was raised in it: stopped, or failed with one line."""
        if isinstance(error, (CancelledError, KeyboardInterrupt)):
            return cls(job, "cancelled")
        if isinstance(error, KvchatError):
            return cls(job, "error", error.one_line(named_in_chat))
        LOGGER.exception("unexpected error while %s", job)
        return cls(job, "error", f"unexpected error: {error} (details in the log file)")


def named_in_chat(setting: str) -> str:
    """How the chat calls a setting an error names (kvchat/errors.py): its field on the settings
    screen (ctrl+s), or else the option `kvchat chat` takes."""
    if setting in setting_names(in_form=True):
        return f"{form_label(setting)} (ctrl+s)"
    return "--" + setting.replace("_", "-")
