"""A question about the whole document (a summary, every clause of a kind), answered from all of
it: the document in parts, each part asked the question (its answer a note, with the passages it
drew on), then the question asked once more of the notes together (map-reduce).

An answer otherwise comes from the entries the question's attention keeps (1,024 by default):
right for a lookup, where the answer sits in a few passages, but a summary or a list needs what
is spread over all of the text. Each part is read whole as a document of its own and nothing of
it is pruned, so all of it is in the cache when its note is written; its reading is saved, so
the next whole-document question about the document loads the parts. The notes are answered
from whole too. The sources are each note's first, most drawn on first. Whether this beats
answering from the kept entries, and for which questions, is measured in `kvchat bench`
(`--variant whole=2048`).
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
from kvchat.events import Done, Event, Notice, Progress, Stats, Token
from kvchat.policy import Full

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
    """A Notice, Progress over the parts' reading, then the answer's Tokens and its Done: its
    sources the notes' first ones, its stats over every part and the notes (tokens read and
    kept, the largest cache), its time to first token from the start. A part holds up to
    `settings.whole` tokens of the text (one sentence longer than that is a part alone)."""
    assert settings.whole is not None
    started = time.perf_counter()
    ranges = part_ranges(document, count_tokens, settings.whole)
    yield Notice(f"a question about the whole document: asking each of its {len(ranges)} parts, then their notes together")
    whole = replace(settings, method=Full(), read="full", auto_stream=False, whole=None)  # nothing pruned
    notes, sources, stats = [], [], []
    finder = SourceFinder(document, None)  # tells where a part's passage is in the whole document
    sizes = [tokens for _, _, tokens in ranges]
    for number, (start, end, _) in enumerate(ranges, start=1):
        part = conversation_for(part_of(document, start, end, f"part {number} of {len(ranges)}"),
                                replace(whole, max_tokens=NOTE_TOKENS), True)
        note = yield from _note(part, question, cancel, (sum(sizes[: number - 1]), sizes[number - 1], sum(sizes)), started)
        notes.append(f"Part {number} of {len(ranges)}:\n{note.answer.strip()}")
        sources += [finder.source_at(source.start + start, source.end + start, source.score) for source in note.sources[:1]]
        stats.append(note.stats)
    notes_document = Document(_named(document, "notes"), "text", "\n\n".join([NOTES_INTRO, *notes]))
    final = conversation_for(notes_document, replace(whole, sources=False), False)
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
                event = Done(event.answer, _over_all([*stats, event.stats], ttft, time.perf_counter() - started),
                             tuple(sorted(sources, key=lambda source: -source.score)))
            if isinstance(event, (Token, Done, Notice)):
                yield event
    finally:
        final.close()


def _over_all(stats: list[Stats], ttft_s: float, total_s: float) -> Stats:
    """The stats of an answer in parts: the last answer's (the notes'), with the tokens read and
    kept over every part and the notes, the largest cache any held, and the reading speed over all."""
    last = stats[-1]
    prompt_tokens = sum(each.prompt_tokens for each in stats)
    read_s = sum(each.read_tokens / each.prefill_tokens_per_s for each in stats if each.prefill_tokens_per_s)
    read_tokens = sum(each.read_tokens for each in stats)
    return replace(
        last, prompt_tokens=prompt_tokens, kept_tokens=sum(each.kept_tokens for each in stats),
        loaded_tokens=sum(each.loaded_tokens for each in stats), kv_bytes_full=max(each.kv_bytes_full for each in stats),
        kv_bytes_kept=max(each.kv_bytes_kept for each in stats), peak_cells=max(each.peak_cells for each in stats),
        prefill_tokens_per_s=read_tokens / read_s if read_s else 0.0, ttft_s=ttft_s, total_s=total_s,
        read=f"in {len(stats) - 1} parts",
    )


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
