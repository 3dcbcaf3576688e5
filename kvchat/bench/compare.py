"""Answer the questions about one document under several settings, reading it as few times as possible."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from kvchat.bench.tasks import Case
from kvchat.documents import Document
from kvchat.engine import AskSettings, Engine, KvLayout
from kvchat.events import Done, Event

Answer = tuple[int, int, list[Event]]  # (case index, variant index, the events of that answer)


def case_document(case: Case) -> Document:
    return Document(path=Path(f"{case.task}.txt"), kind="text", text=case.document)


def for_case(settings: AskSettings, case: Case) -> AskSettings:
    """`settings` with the case's own system prompt (unless the settings name one: a variant's)
    and answer length, where it has them."""
    return replace(settings, system=settings.system or case.system, max_tokens=case.max_tokens or settings.max_tokens)


def _one_reading(engine: Engine, cases: list[Case], variants: dict[int, AskSettings], observer: str | None) -> Iterator[Answer]:
    """Read the cases' document once, then answer every case under every variant, each from the
    restored reading. An answer's events include the reading's (a streamed reading prunes there)."""
    widest = max((for_case(settings, case) for settings in variants.values() for case in cases), key=lambda s: s.max_tokens)
    conversation = engine.conversation(case_document(cases[0]), widest)
    try:
        reading = list(conversation.open(question=observer))
        for case_index, case in enumerate(cases):
            for variant_index, settings in variants.items():
                conversation.reset()
                asked = engine.answer(conversation, case.question, for_case(settings, case))
                yield case_index, variant_index, reading + list(asked)
    finally:
        conversation.close()


def compare(engine: Engine, cases: list[Case], variants: list[AskSettings]) -> Iterator[Answer]:
    """Every variant's answer to every case; the cases share one document.

    Methods that prune after reading share one reading for all cases and variants (one per KV
    layout and system prompt), so they differ only in what they keep. A method that streams reads its own way: once for all cases when the
    question plays no part in what it keeps (StreamingLLM), once per case when the question observes
    the reading (SnapStream); so does a fast reading, once per case, and an answer from the
    document's parts (settings.in_parts "on") reads the parts once per case. Where a fast reading
    does not pay (cheap_pass.pays: a short document), the defaults read the whole document, question
    apart, as the methods that prune after reading do: such a variant shares their reading."""
    reads_fast = [engine.plan(case_document(cases[0]), for_case(settings, cases[0])).reads_fast for settings in variants]
    in_parts = [settings.in_parts == "on" for settings in variants]
    after_reading: dict[tuple[KvLayout, str | None], dict[int, AskSettings]] = {}
    for index, settings in enumerate(variants):  # the layout and the system prompt are part of the reading
        if not settings.method.streams and not reads_fast[index] and not in_parts[index]:
            after_reading.setdefault((settings.layout, settings.system), {})[index] = settings
    for in_layout in after_reading.values():
        yield from _one_reading(engine, cases, in_layout, None)
    for index, settings in enumerate(variants):
        if in_parts[index]:  # answered from the document's parts, each case on its own (answering/in_parts.py)
            for case_index, case in enumerate(cases):
                yield case_index, index, list(engine.ask(case_document(case), case.question, for_case(settings, case)))
            continue
        if reads_fast[index]:  # a fast reading is the question's own
            for case_index, case in enumerate(cases):
                for _, variant_index, events in _one_reading(engine, [case], {index: settings}, None):
                    yield case_index, variant_index, events
            continue
        if not settings.method.streams:
            continue
        if not settings.method.scores:
            yield from _one_reading(engine, cases, {index: settings}, None)
            continue
        for case_index, case in enumerate(cases):
            for _, variant_index, events in _one_reading(engine, [case], {index: settings}, case.question):
                yield case_index, variant_index, events


def answer_of(events: list[Event]) -> Done:
    done = events[-1]
    assert isinstance(done, Done)
    return done
