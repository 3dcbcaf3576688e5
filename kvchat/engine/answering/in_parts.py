"""A question about the whole document (a summary, every clause of a kind), answered from all of
it: the document in parts, each part asked the question in turn, the answer each part's answer
under its heading ("Part 2 of 4 (pp. 3–5):"), streamed as it is written.

An answer otherwise comes from the entries the question's attention keeps (1,024 by default):
right for a lookup, where the answer sits in a few passages, but a summary or a list needs what
is spread over all of the text. Each part is read whole as a document of its own and nothing of
it is pruned, so all of it is in the cache when its answer is written; its reading is saved (with the parts', in a
store of their own: Engine.conversation_for_part), so the next whole-document question about the
document loads the parts. The parts' answers are not
asked once more to be combined: the default model, so asked, copied the first notes and dropped
the last ones (the sample's governing law, clauses of a list; docs/bench/design-history.md,
"Each part's answer is the answer"). The sources are each part's first, in the parts' order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from pathlib import Path

from kvchat.documents import Document, Page
from kvchat.engine.answering.from_kept import answer_from_kept
from kvchat.engine.text.sources import SourceFinder, passages
from kvchat.engine.conversation import Conversation
from kvchat.engine.settings import AskSettings
from kvchat.errors import CancelledError, raise_if_cancelled
from kvchat.events import Done, Event, Notice, Progress, Source, Stats, Token
from kvchat.policy import Full

PART_TOKENS = 192  # a part's answer: what it says on the question, with room for a short list
CUT = " …"  # after a part's answer that PART_TOKENS (or the user's max tokens) cut
# kvchat's instruction for a part's answer, unless the user gives a system prompt: its own says
# "keep the answer short", right for a lookup, wrong for a summary or a list, which must keep
# what every part says.
PART_SYSTEM = ("You answer a question about one part of a longer document. Answer from this part only: give every "
               "point of it that bears on the question, with its names, numbers, dates, places and durations exactly "
               "as written. If this part says nothing on it, say so in a few words.")

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


def part_settings(settings: AskSettings) -> AskSettings:
    """The settings a part is answered with: read whole (nothing pruned), at most PART_TOKENS,
    kvchat's part instruction unless the user gave a system prompt; on a context of its own, what
    a server's sequence holds (`kept_cells`) does not bound it."""
    return replace(settings, method=Full(), read="full", method_named=True, in_parts="off",
                   max_tokens=min(settings.max_tokens, PART_TOKENS), system=settings.system or PART_SYSTEM, kept_cells=None)


def answer_in_parts(
    conversation_for: ConversationFor, document: Document, question: str, settings: AskSettings,
    count_tokens: Callable[[str], int], cancel: threading.Event | None = None,
) -> Iterator[Event]:
    """A Notice, then each part in turn asked the question (_answer_part), then Done: its answer
    all of theirs, each under its heading; its sources each part's first; its stats every
    part's (_over_parts), the time to first token the first part's first token from the start.
    A part holds up to `settings.part_tokens` tokens of the text (one sentence longer than that
    is a part alone). Stopped (`cancel`) once some text was shown, the answer ends there, its
    Done's stop reason "cancelled", as an answer stopped while it is written does; before
    that, CancelledError, as for any reading."""
    started = time.perf_counter()
    ranges = part_ranges(document, count_tokens, settings.part_tokens)
    yield Notice("a question about the whole document: " + (f"answering it from each of its {len(ranges)} parts in turn"
                                                            if len(ranges) > 1 else "answering it from all of it, in one part"))
    finder = SourceFinder(document, None)  # tells where a part, and a part's passage, is in the whole document
    sizes = [tokens for _, _, tokens in ranges]
    answers: list[str] = []
    sources: list[Source] = []
    stats: list[Stats] = []
    first_token_at: float | None = None
    stopped = False
    for number, (start, end, _) in enumerate(ranges, start=1):
        what = f"part {number} of {len(ranges)}"
        heading = (("\n\n" if number > 1 else "") + f"{what.capitalize()} ({_where(finder, start, end)}):\n\n"
                   if len(ranges) > 1 else "")
        share = (sum(sizes[: number - 1]), sizes[number - 1], sum(sizes))
        shown = ""
        try:
            raise_if_cancelled(cancel)
            if number > 1:  # the answer says where it goes on while the part is read
                yield Token(heading)
                shown = heading
            part = conversation_for(part_of(document, start, end, what), part_settings(settings), True)
            done, first_at = yield from _answer_part(part, question, heading if number == 1 else "", cancel, share)
        except CancelledError:
            if not answers:  # nothing shown yet
                raise
            answers.append(shown)
            stopped = True
            break
        first_token_at = first_token_at or first_at
        answers.append(heading + done.answer)
        sources += [finder.source_at(source.start + start, source.end + start, source.score) for source in done.sources[:1]]
        stats.append(done.stats)
        if done.stats.stop_reason == "cancelled":
            stopped = True
            break
    ttft_s = (first_token_at or time.perf_counter()) - started
    over = _over_parts(stats, ttft_s, time.perf_counter() - started)
    yield Done("".join(answers), replace(over, stop_reason="cancelled") if stopped else over, tuple(sources))


def _answer_part(
    part: Conversation, question: str, heading: str, cancel: threading.Event | None,
    share: tuple[int, int, int],
) -> Generator[Event, None, tuple[Done, float | None]]:
    """A part's reading's Progress, `heading` (the first part's: a front end shows a reading bar
    until the text begins), its answer's Tokens (CUT after them where the answer's length cut
    it); returns its Done and when its first token came."""
    first_token_at = None
    try:
        yield from _read(part, question, cancel, share)
        if heading:
            yield Token(heading)
        done = None
        for event in answer_from_kept(part, question, part.settings, cancel):
            if isinstance(event, Token):
                first_token_at = first_token_at or time.perf_counter()
                yield event
            elif isinstance(event, Done):
                done = event
        assert done is not None  # an answer ends with its Done
        if done.stats.stop_reason == "max_tokens":  # the part's answer was cut: the reader is told so
            yield Token(CUT)
            done = replace(done, answer=done.answer + CUT)
        return done, first_token_at
    finally:
        part.close()


def _where(finder: SourceFinder, start: int, end: int) -> str:
    """Where text[start:end] is, as a source says it: "pp. 3–5", or the line it starts on."""
    where = finder.where(start, end)
    return f"from {where}" if where.startswith("line ") else where


def _read(conversation: Conversation, question: str, cancel: threading.Event | None,
          share: tuple[int, int, int]) -> Iterator[Event]:
    """A part's reading, its Progress told over the whole document's tokens (`share`: those
    before the part, the part's, the document's), at the speed of the part's own reading."""
    before, size, total = share
    for event in conversation.open(question, cancel=cancel):
        if isinstance(event, Progress):
            done, read_from = (before + size * count // max(event.total, 1) for count in (event.done, event.read_from))
            yield Progress(done, total, event.elapsed_s, read_from=read_from)


def _over_parts(stats: list[Stats], ttft_s: float, total_s: float) -> Stats:
    """The stats of an answer in parts: the tokens read, kept, loaded and written over every
    part, the largest cache any held, the reading and writing speeds over all."""
    read = [each for each in stats if each.prefill_tokens_per_s]
    written = [each for each in stats if each.decode_tokens_per_s]
    read_s = sum(each.read_tokens / each.prefill_tokens_per_s for each in read)
    written_s = sum(each.generated_tokens / each.decode_tokens_per_s for each in written)
    read_tokens, written_tokens = sum(each.read_tokens for each in read), sum(each.generated_tokens for each in written)
    return replace(
        stats[-1], prompt_tokens=sum(each.prompt_tokens for each in stats), kept_tokens=sum(each.kept_tokens for each in stats),
        loaded_tokens=sum(each.loaded_tokens for each in stats), generated_tokens=sum(each.generated_tokens for each in stats),
        kv_bytes_full=max(each.kv_bytes_full for each in stats), kv_bytes_kept=max(each.kv_bytes_kept for each in stats),
        peak_cells=max(each.peak_cells for each in stats), prefill_tokens_per_s=read_tokens / read_s if read_s else 0.0,
        decode_tokens_per_s=written_tokens / written_s if written_s else 0.0, ttft_s=ttft_s, total_s=total_s,
        read=f"in {len(stats)} part" + ("" if len(stats) == 1 else "s"),
    )
