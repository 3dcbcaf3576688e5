"""The questions about a new document read fast (cheap_pass.py: the question chooses what the model
reads) until the document is read whole, with another way, for the questions after
(Conversation.read_on; Conversation.select says when a question waits for that instead); or,
for retrieval, every question reads fast and the document is never read whole for them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.ways.reading import DocumentPrompt, Observer, Reading
from kvchat.engine.reading.ways.whole import WholeReading
from kvchat.engine.settings import AskSettings
from kvchat.events import Event


@dataclass(frozen=True)
class FastFirst(Reading):
    name = "fast"

    whole: Reading = WholeReading()  # how the document is read whole after the first fast answer
    then_whole: bool = True  # False: every question reads fast, and a saved reading is left unloaded

    def defers(self, saved: bool) -> bool:
        return not saved or not self.then_whole  # a saved reading is loaded at once: nothing to read fast

    @property
    def reads_on(self) -> bool:
        return self.then_whole

    def read(
        self, document: DocumentPrompt, run: PromptRun, settings: AskSettings, cancel: threading.Event | None,
        observer: Observer,
    ) -> Iterator[Event]:
        yield from self.whole.read(document, run, settings, cancel, observer)
