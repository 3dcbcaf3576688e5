"""A way of reading: how a conversation's document comes into its cache (the ways, one file each
in this folder, in the spirit of the selections and of kvpress's presses; registry.py chooses)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.settings import AskSettings
from kvchat.events import Event, LaterReading


@dataclass(frozen=True)
class DocumentPrompt:
    """What there is to read of a conversation's document: the document part's tokens."""

    tokens: list[int]
    label: str  # names the reading where it is saved
    states: DocumentStates | None = None  # where its readings are saved (None: nowhere)


Observer = Callable[[], list[int] | None]  # the question's window that observes a streamed reading, if known


@dataclass(frozen=True)
class Reading:
    """A way of reading a document whole into a PromptRun."""

    name: ClassVar[str] = ""
    speed: ClassVar[str] = "read"  # what its measured speed is remembered as (speeds.py)

    def defers(self, saved: bool) -> bool:
        """Whether open() leaves the reading to the questions, which read fast meanwhile
        (`saved`: a reading of the document is saved)."""
        return False

    @property
    def later(self) -> LaterReading | None:
        """What a document its questions read fast (or in parts) is read as after them
        (Conversation.read_on): whole, for the questions after to be selected from that reading;
        None: nothing, every question reads fast (retrieval)."""
        return LaterReading.WHOLE

    def read(
        self, document: DocumentPrompt, run: PromptRun, settings: AskSettings, cancel: threading.Event | None,
        observer: Observer,
    ) -> Iterator[Event]:
        """Read `document` whole into `run` (from run.read_upto on) and make it the restore point."""
        raise NotImplementedError

