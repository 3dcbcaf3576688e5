"""Answer one case under several settings from a single reading of its document."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvchat.bench.tasks import Case
from kvchat.documents import Document
from kvchat.engine import AskSettings, Engine
from kvchat.events import Done, Event


def case_document(case: Case) -> Document:
    return Document(path=Path(f"{case.task}.txt"), kind="text", text=case.document)


def compare(engine: Engine, case: Case, variants: list[AskSettings]) -> Iterator[list[Event]]:
    """The events of each variant's answer. The document is read once; every variant starts
    from a restored copy of that reading, so they differ only in what they keep."""
    widest = max(variants, key=lambda settings: settings.max_tokens)
    conversation = engine.conversation(case_document(case), widest)
    try:
        for _ in conversation.open():
            pass
        for settings in variants:
            conversation.reset()
            yield list(conversation.ask(case.question, settings=settings))
    finally:
        conversation.close()


def answer_of(events: list[Event]) -> Done:
    done = events[-1]
    assert isinstance(done, Done)
    return done
