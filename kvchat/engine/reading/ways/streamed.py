"""The document read within the budget, chunk by chunk (reading/chunked.py): for a streaming method, and
for a document longer than the model's context."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.ways.reading import DocumentPrompt, Observer, Reading
from kvchat.engine.settings import AskSettings
from kvchat.events import Event


@dataclass(frozen=True)
class StreamedReading(Reading):
    name = "streamed"
    speed = "stream"

    def read(
        self, document: DocumentPrompt, run: PromptRun, settings: AskSettings, cancel: threading.Event | None,
        observer: Observer,
    ) -> Iterator[Event]:
        window = observer() if settings.stream.query_aware else None  # query-aware streaming, when the question is known
        yield from run.stream(document.tokens, window, settings, cancel)
        run.save()
