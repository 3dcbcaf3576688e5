"""Several documents, each read (or loaded) on its own and the readings put together (compose.py):
each is saved and reused alone in any combination. Measured, it lost to reading them as one text
(each seeing those before it; the combination's reading saved): 26 points on two contracts asked
together (bench/several_documents.py), mixing up which document said what. So no front end reads
so; the bench asks for it (Engine.conversation's `reading`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from kvchat.engine.reading.prompt_run import PromptRun
from kvchat.engine.reading.way import DocumentPrompt, Observer, Reading
from kvchat.engine.settings import AskSettings
from kvchat.events import Event


@dataclass(frozen=True)
class ComposedReading(Reading):
    name = "composed"
    shares_cells = True

    def read(
        self, document: DocumentPrompt, run: PromptRun, settings: AskSettings, cancel: threading.Event | None,
        observer: Observer,
    ) -> Iterator[Event]:
        assert document.runs is not None
        prefix, *blocks, suffix = document.runs
        yield from run.compose(prefix, blocks, suffix, document.states, list(document.names), cancel)
        run.save()
