"""Answer one case under several settings, reading its document as few times as possible."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from kvchat.bench.tasks import Case
from kvchat.documents import Document
from kvchat.engine import AskSettings, Engine
from kvchat.events import Done, Event


def case_document(case: Case) -> Document:
    return Document(path=Path(f"{case.task}.txt"), kind="text", text=case.document)


def _shared_reading(engine: Engine, case: Case, variants: list[AskSettings]) -> Iterator[list[Event]]:
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


def _own_reading(engine: Engine, case: Case, settings: AskSettings) -> list[Event]:
    conversation = engine.conversation(case_document(case), settings)
    try:
        events = list(conversation.open(question=case.question))
        return events + list(conversation.ask(case.question))
    finally:
        conversation.close()


def compare(engine: Engine, case: Case, variants: list[AskSettings]) -> Iterator[list[Event]]:
    """The events of each variant's answer, in order. Methods that prune after reading share one
    reading (each starts from a restored copy, so they differ only in what they keep); streamed
    methods read the document their own way."""
    shared = [settings for settings in variants if not settings.method.streams]
    shared_events = iter(_shared_reading(engine, case, shared) if shared else [])
    for settings in variants:
        yield _own_reading(engine, case, settings) if settings.method.streams else next(shared_events)


def answer_of(events: list[Event]) -> Done:
    done = events[-1]
    assert isinstance(done, Done)
    return done
