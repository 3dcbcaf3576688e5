"""Every layer reads the whole document (or its saved reading is loaded and read on)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.ways.reading import DocumentPrompt, Observer, Reading
from kvchat.engine.settings import AskSettings
from kvchat.events import Event


@dataclass(frozen=True)
class WholeReading(Reading):
    name = "full"

    def read(
        self, document: DocumentPrompt, run: PromptRun, settings: AskSettings, cancel: threading.Event | None,
        observer: Observer,
    ) -> Iterator[Event]:
        tokens = document.tokens
        yield from run.open(tokens, len(tokens), document.states, document.label, cancel)
