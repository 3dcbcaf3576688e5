"""A question about the whole document (a summary, every clause of a kind), answered from all of
it: the document in parts, each part asked the question (its answer a note, with the passages it
drew on), then the question asked once more of the notes together (map-reduce).

An answer otherwise comes from the entries the question's attention keeps (1,024 by default):
right for a lookup, where the answer sits in a few passages, but a summary or a list needs what
is spread over all of the text. Each part is read as a document of its own, so that all of it is
in the cache when its note is written, and saved as such, so that the next whole-document
question about the document loads the parts. The sources are each note's, in the parts' order.
Whether this beats answering from the kept entries, and for which questions, is measured in
`kvchat bench` (`--variant whole=2048`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from pathlib import Path

from kvchat.documents import Document, Page
from kvchat.engine.answering.sources import SourceFinder, passages
from kvchat.engine.conversation import Conversation
from kvchat.engine.settings import AskSettings
from kvchat.events import Done, Event, Notice, Progress, Source, Token

NOTE_TOKENS = 192  # a part's note: what it says on the question, with room for a short list
NOTES_INTRO = "Notes on each part of the document, each answering the question from that part alone:"

ConversationFor = Callable[[Document, AskSettings, bool], Conversation]  # document, settings, whether its reading is saved


def part_ranges(document: Document, count_tokens: Callable[[str], int], part_tokens: int) -> list[tuple[int, int, int]]:
    """The (start, end, tokens) of `document`'s parts, [start, end) in its text: its passages
    (sentences and lines) laid end to end until a part would pass `part_tokens`, so that no part
    cuts a sentence (one longer than a part is a part alone)."""
    ranges: list[tuple[int, int, int]] = []
    start, tokens = 0, 0
    for passage_start, passage_end in passages(document.text):
        size = count_tokens(document.text[passage_start:passage_end])
        if tokens and tokens + size > part_tokens:
            ranges.append((start, passage_start, tokens))
            start, tokens = passage_start, 0
        tokens += size
    return [*ranges, (start, len(document.text), tokens)] if document.text else []


def _named(document: Document, what: str) -> Path:
    """`document`'s path with what part of it this is said ("contract.pdf (part 2 of 5)")."""
    return document.path.with_name(f"{document.path.name} ({what})")


def part_of(document: Document, start: int, end: int, what: str) -> Document:
    """text[start:end] of `document` as a document of its own, its pages as they fall in it."""
    text = document.text[start:end].rstrip()
    pages = [replace(page, start=max(page.start, start) - start, end=min(page.end, start + len(text)) - start)
             for page in document.pages if page.start < start + len(text) and start < page.end]
    return Document(_named(document, what), document.kind, text, pages or [Page(1, 0, len(text))])


def answer_in_parts(
    conversation_for: ConversationFor, document: Document, question: str, settings: AskSettings,
    count_tokens: Callable[[str], int], cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """A Notice, Progress over the parts' reading, then the answer's Tokens and its Done (its stats
    the last answer's, its time to first token from the start; its sources the notes'). The
    parts are `settings.whole` tokens at most."""
    assert settings.whole is not None
    started = time.perf_counter()
    ranges = part_ranges(document, count_tokens, settings.whole)
    yield Notice(f"a question about the whole document: asking each of its {len(ranges)} parts, then their notes together")
    notes, sources = [], []
    finder = SourceFinder(document, None)  # tells where a part's passage is in the whole document
    sizes = [tokens for _, _, tokens in ranges]
    for number, (start, end, _) in enumerate(ranges, start=1):
        part = conversation_for(part_of(document, start, end, f"part {number} of {len(ranges)}"),
                                replace(settings, max_tokens=NOTE_TOKENS, whole=None), True)
        note = yield from _note(part, question, cancel, (sum(sizes[: number - 1]), sizes[number - 1], sum(sizes)), started)
        notes.append(f"Part {number} of {len(ranges)}:\n{note.answer.strip()}")
        sources += [finder.source_at(source.start + start, source.end + start, source.score) for source in note.sources]
    notes_document = Document(_named(document, "notes"), "text", "\n\n".join([NOTES_INTRO, *notes]))
    final = conversation_for(notes_document, replace(settings, sources=False, read="full", whole=None), False)
    try:
        for event in final.open(question, cancel=cancel):
            if isinstance(event, Notice):
                yield event
        first_token_at = None
        for event in final.ask(question, cancel=cancel):
            if isinstance(event, Token) and first_token_at is None:
                first_token_at = time.perf_counter()
            if isinstance(event, Done):
                ttft = (first_token_at or time.perf_counter()) - started
                stats = replace(event.stats, ttft_s=ttft, total_s=time.perf_counter() - started, read=f"in {len(ranges)} parts")
                event = Done(event.answer, stats, tuple(sources))
            if isinstance(event, (Token, Done, Notice)):
                yield event
    finally:
        final.close()


def _note(conversation: Conversation, question: str, cancel: threading.Event | None, share: tuple[int, int, int],
          started: float) -> Generator[Event, None, Done]:
    """One part's answer to the question; its reading's Progress told over the whole document's
    tokens (`share`: those before the part, the part's, the document's), so one bar fills once."""
    before, size, total = share
    try:
        for event in conversation.open(question, cancel=cancel):
            if isinstance(event, Progress):
                done = before + size * event.done // max(event.total, 1)
                yield Progress(done=done, total=total, elapsed_s=time.perf_counter() - started)
        done_event = None
        for event in conversation.ask(question, cancel=cancel):
            if isinstance(event, Done):
                done_event = event
        assert done_event is not None  # an answer ends with its Done
        return done_event
    finally:
        conversation.close()
