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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvchat.documents import Document, Page
from kvchat.engine.answering.sources import SourceFinder, passages
from kvchat.engine.settings import AskSettings
from kvchat.events import Done, Event, Notice, Progress, Source, Stats, Token
from kvchat.policy import Full

if TYPE_CHECKING:  # a conversation answers in parts through conversations of its own
    from kvchat.engine.conversation import Conversation

NOTE_TOKENS = 192  # a part's note: what it says on the question, with room for a short list
NOTES_INTRO = "Notes on each part of the document, each answering the question from that part alone:"
# kvchat's instructions for the two steps, unless the user gives a system prompt: its own says
# "keep the answer short", right for a lookup, wrong for a summary or a list, which must keep
# what every part says.
PART_SYSTEM = ("You answer a question about one part of a longer document. Answer from this part only: give every "
               "point of it that bears on the question, with its names, numbers, dates, places and durations exactly "
               "as written. If this part says nothing on it, say so in a few words.")
NOTES_SYSTEM = ("You answer a question about a document from notes on each of its parts. Combine the notes into one "
                "answer that keeps every distinct point of every note, with its names, numbers, dates, places and "
                "durations, says each point once, and adds nothing the notes do not say.")

ConversationFor = Callable[[Document, AskSettings, bool], "Conversation"]  # document, settings, whether its reading is saved


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


@dataclass(frozen=True)
class Notes:
    """Each part's answer to the question, as the document the question is asked of last."""

    document: Document
    sources: tuple[Source, ...]  # each note's first, placed in the whole document, most drawn on first
    stats: tuple[Stats, ...]  # each part's answer's, and those of the notes asked again (_combined)
    parts: int

    def with_parts(self, last: Stats) -> Stats:
        """The stats of the answer from the notes (`last`), with the tokens read and kept over
        every part and the notes, the largest cache any held, and the reading speed over all."""
        stats = [*self.stats, last]
        read_s = sum(each.read_tokens / each.prefill_tokens_per_s for each in stats if each.prefill_tokens_per_s)
        read_tokens = sum(each.read_tokens for each in stats)
        return replace(
            last, prompt_tokens=sum(each.prompt_tokens for each in stats), kept_tokens=sum(each.kept_tokens for each in stats),
            loaded_tokens=sum(each.loaded_tokens for each in stats), kv_bytes_full=max(each.kv_bytes_full for each in stats),
            kv_bytes_kept=max(each.kv_bytes_kept for each in stats), peak_cells=max(each.peak_cells for each in stats),
            prefill_tokens_per_s=read_tokens / read_s if read_s else 0.0, read=f"in {_parts(self.parts)}",
        )


def _parts(count: int) -> str:
    return "1 part" if count == 1 else f"{count} parts"


def notes_settings(settings: AskSettings) -> AskSettings:
    """The settings the notes are answered with: whole, as the parts are, and without sources
    (the answer's are the parts')."""
    return replace(_whole(settings), sources=False, system=settings.system or NOTES_SYSTEM)


def _whole(settings: AskSettings) -> AskSettings:
    return replace(settings, method=Full(), read="full", auto_stream=False, whole="off")  # nothing pruned


def notes_on_parts(
    conversation_for: ConversationFor, document: Document, question: str, settings: AskSettings,
    count_tokens: Callable[[str], int], cancel: threading.Event | None = None, started: float | None = None,
) -> Generator[Event, None, Notes]:
    """A Notice, then Progress over the parts' reading (from `started`), each part asked the
    question on a context of its own; returns their Notes. A part holds up to
    `settings.part_tokens` tokens of the text (one sentence longer than that is a part alone)."""
    started = time.perf_counter() if started is None else started
    ranges = part_ranges(document, count_tokens, settings.part_tokens)
    yield Notice("a question about the whole document: " + (f"asking each of its {len(ranges)} parts, then their notes together"
                                                            if len(ranges) > 1 else "answering it from all of it, in one part"))
    notes, sources, stats = [], [], []
    finder = SourceFinder(document, None)  # tells where a part's passage is in the whole document
    sizes = [tokens for _, _, tokens in ranges]
    for number, (start, end, _) in enumerate(ranges, start=1):
        part = conversation_for(part_of(document, start, end, f"part {number} of {len(ranges)}"),
                                replace(_whole(settings), max_tokens=NOTE_TOKENS, system=settings.system or PART_SYSTEM), True)
        note = yield from _note(part, question, cancel, (sum(sizes[: number - 1]), sizes[number - 1], sum(sizes)), started)
        notes.append(_PartNote(number, number, len(ranges), note.answer.strip()))
        sources += [finder.source_at(source.start + start, source.end + start, source.score) for source in note.sources[:1]]
        stats.append(note.stats)
    notes = yield from _combined(conversation_for, document, question, settings, count_tokens, notes, stats, cancel,
                                 (sum(sizes), 0, sum(sizes)), started)
    return Notes(_notes_document(document, notes), tuple(sorted(sources, key=lambda source: -source.score)), tuple(stats),
                 len(ranges))


@dataclass(frozen=True)
class _PartNote:
    """The note of parts first..last of n_parts."""

    first: int
    last: int
    n_parts: int
    text: str

    def __str__(self) -> str:
        which = f"Part {self.first}" if self.first == self.last else f"Parts {self.first} to {self.last}"
        return f"{which} of {self.n_parts}:\n{self.text}"


def _notes_document(document: Document, notes: list[_PartNote]) -> Document:
    return Document(_named(document, "notes"), "text", "\n\n".join([NOTES_INTRO, *map(str, notes)]))


def _combined(
    conversation_for: ConversationFor, document: Document, question: str, settings: AskSettings,
    count_tokens: Callable[[str], int], notes: list[_PartNote], stats: list[Stats], cancel: threading.Event | None,
    read: tuple[int, int, int], started: float,
) -> Generator[Event, None, list[_PartNote]]:
    """`notes`, or while together they are more than the budget's tokens, the notes of runs of
    them asked the question again (their notes in turn; their stats added to `stats`), so that
    the last answer reads no more than any other prompt keeps (a server's sequence holds it).
    `read`: the Progress share of the document they tell (all of it: the reading is done)."""
    limit = settings.method.budget
    while len(notes) > 1 and count_tokens(_notes_document(document, notes).text) > limit:
        yield Notice(f"the notes of {len(notes)} parts are more than {limit:,} tokens: asking runs of them in turn")
        runs: list[list[_PartNote]] = [[]]
        for note in notes:  # each run two notes at least, then as many as fit in the budget
            if len(runs[-1]) >= 2 and count_tokens(_notes_document(document, [*runs[-1], note]).text) > limit:
                runs.append([])
            runs[-1].append(note)
        combined = []
        for run in runs:
            if len(run) == 1:  # the last note, left alone: it goes on as it is
                combined += run
                continue
            answer = conversation_for(_notes_document(document, run), replace(notes_settings(settings), max_tokens=NOTE_TOKENS), False)
            note = yield from _note(answer, question, cancel, read, started)
            combined.append(_PartNote(run[0].first, run[-1].last, run[0].n_parts, note.answer.strip()))
            stats.append(note.stats)
        notes = combined
    return notes


def answer_in_parts(
    conversation_for: ConversationFor, document: Document, question: str, settings: AskSettings,
    count_tokens: Callable[[str], int], cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """notes_on_parts(), then the answer from the notes: its Tokens and its Done, whose sources
    are the parts', whose stats count every part and the notes (Notes.with_parts), whose time
    to first token runs from the start."""
    started = time.perf_counter()
    notes = yield from notes_on_parts(conversation_for, document, question, settings, count_tokens, cancel, started)
    final = conversation_for(notes.document, notes_settings(settings), False)
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
                stats = replace(notes.with_parts(event.stats), ttft_s=ttft, total_s=time.perf_counter() - started)
                event = Done(event.answer, stats, notes.sources)
            if isinstance(event, (Token, Done, Notice)):
                yield event
    finally:
        final.close()


def _note(conversation: "Conversation", question: str, cancel: threading.Event | None,
          share: tuple[int, int, int], started: float) -> Generator[Event, None, Done]:
    """One part's answer to the question; its reading's Progress told over the whole document's
    tokens (`share`: those before the part, the part's, the document's), so one bar fills once.
    The note's tokens are not the answer's: each one is told as the Progress so far, so that a
    server's other answers take their turns meanwhile (serving/scheduler.py)."""
    before, size, total = share
    progress = Progress(done=before, total=total, elapsed_s=time.perf_counter() - started)
    try:
        for event in conversation.open(question, cancel=cancel):
            if isinstance(event, Progress):
                progress = Progress(before + size * event.done // max(event.total, 1), total, time.perf_counter() - started)
                yield progress
        done_event = None
        for event in conversation.ask(question, cancel=cancel):
            if isinstance(event, Token):
                yield progress
            elif isinstance(event, Done):
                done_event = event
        assert done_event is not None  # an answer ends with its Done
        return done_event
    finally:
        conversation.close()
