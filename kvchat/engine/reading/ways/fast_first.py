"""The questions about a new document read fast (fast_reading.py: the question chooses what the model
reads); the document is read afterwards for the questions after (Conversation.read_on): as its
passages, from which those load what they choose (passage_bank.py), or whole, with another way,
to select from (Conversation.select says when a question waits for that instead); or, for
retrieval, every question reads fast and nothing more is read for them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.ways.reading import DocumentPrompt, Observer, Reading
from kvchat.engine.reading.ways.whole import WholeReading
from kvchat.engine.settings import AskSettings
from kvchat.events import Event, LaterReading


@dataclass(frozen=True)
class FastFirst(Reading):
    name = "fast"

    whole: Reading = WholeReading()  # how the document is read whole, where it is (a saved reading loads, `later` WHOLE)
    then: LaterReading | None = LaterReading.WHOLE  # None: every question reads fast, and a saved reading is left unloaded

    def defers(self, saved: bool) -> bool:
        return not saved or self.then is None  # a saved whole reading is loaded at once: nothing to read fast

    @property
    def later(self) -> LaterReading | None:
        return self.then

    def read(
        self, document: DocumentPrompt, run: PromptRun, settings: AskSettings, cancel: threading.Event | None,
        observer: Observer,
    ) -> Iterator[Event]:
        yield from self.whole.read(document, run, settings, cancel, observer)
