"""A fake engine for the chat app's tests: scripted events, real cancellation, and a pace the test
sets (a paced reading or answer takes each chunk or token only when the test allows it)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvchat.documents import Document, Page, PageProgress, bundle
from kvchat.engine import AskSettings
from kvchat.engine.kvcache.foreground import Foreground
from kvchat.errors import CancelledError, KvchatError
from kvchat.events import Done, Event, Notice, Progress, Pruned, Source, Stats, Token

DOCUMENT_TEXT = "Field notes. The boat was named the Grey Heron. The radio failed on day four."
ANSWER = ["The boat ", "was named ", "the **Grey Heron**."]
RADIO = DOCUMENT_TEXT.index("The radio")
SENTENCES = ((0, 12), (13, 47), (RADIO, len(DOCUMENT_TEXT)))  # the three "tokens" of a selection per head
PRUNED = Pruned(prompt_tokens=2000, kept_tokens=256, kept_positions=tuple(range(256)))
PRUNED_PER_HEAD = Pruned(prompt_tokens=2000, kept_tokens=2, kept_positions=(0, 1, 2), kept_heads=(4, 1, 4), head_count=4)
SOURCES = (Source(start=RADIO, end=len(DOCUMENT_TEXT), text=DOCUMENT_TEXT[RADIO:], score=0.6, where="line 1"),
           Source(start=0, end=12, text="Field notes.", score=0.3, where="line 1"))


def fake_stats(settings: AskSettings, generated: int) -> Stats:
    return Stats(
        model="fake", method=settings.method.name, budget=settings.method.budget, prompt_tokens=2000,
        loaded_tokens=0, kept_tokens=256, generated_tokens=generated, kv_bytes_full=2000 * 12288, kv_bytes_kept=256 * 12288,
        prefill_tokens_per_s=400.0, decode_tokens_per_s=25.0, ttft_s=0.5, total_s=1.0, peak_cells=2000,
        stop_reason="end", read="fast 12/24 layers" if settings.read == "fast" else "full",
    )


WAIT_S = 10.0  # how long a paced session waits for the test to allow its next step


@dataclass
class FakeSession:
    document: Document
    paced_reading: bool = False  # each chunk of the reading waits for allow()
    paced_answer: bool = False  # each token of an answer waits for allow()
    answer: list[str] = field(default_factory=lambda: list(ANSWER))
    token_count: int = 2000
    sources: tuple[Source, ...] = ()  # each answer's
    pruned: Pruned = PRUNED  # what each answer's selection kept
    asked: list[tuple[str, AskSettings]] = field(default_factory=list)
    turns: int = 0
    resets: int = 0
    closed: bool = False
    chunks_read: int = 0
    tokens_sent: int = 0
    unread: bool = False  # a fast answer came first: the whole document is still to be read
    paced_reading_on: bool = False  # each chunk of that reading waits for allow()
    read_on_upto: int = 0  # how far it got
    follow_ups_read_fast: bool = False  # a follow-up before the whole reading is done reads fast, not the rest
    chunks_read_on: list[tuple[str, int]] = field(default_factory=list)  # (who read it: "background" or a question, where)
    foreground: Foreground | None = None  # the questions of every process, where the test holds one
    _allowed: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def allow(self, steps: int = 1) -> None:
        """Let a paced reading read `steps` more chunks, or a paced answer send `steps` more tokens."""
        self._allowed.release(steps)

    def _wait_turn(self, paced: bool) -> None:
        if paced and not self._allowed.acquire(timeout=WAIT_S):
            raise AssertionError("the test never allowed the session's next step")

    def read(self, cancel: threading.Event) -> Iterator[Event]:
        for done in range(0, 2001, 500):
            self._wait_turn(self.paced_reading)
            if cancel.is_set():
                raise CancelledError("stopped", "")
            self.chunks_read += 1
            yield Progress(done=done, total=2000, elapsed_s=done / 400)
        yield Notice("read notes.txt")

    def read_on(self, cancel: threading.Event, paused: Callable[[bool], None]) -> Iterator[Event]:
        """As EngineSession's: between chunks it gives way to the questions `foreground` holds."""
        reading = self._read_on("background", cancel, self.paced_reading_on)
        return reading if self.foreground is None else self.foreground.giving_way(reading, cancel, paused)

    def _read_on(self, reader: str, cancel: threading.Event, paced: bool) -> Iterator[Event]:
        while self.unread:
            self._wait_turn(paced)
            if cancel.is_set():
                raise CancelledError("stopped", "")
            self.chunks_read_on.append((reader, self.read_on_upto))
            self.read_on_upto += 500
            self.unread = self.read_on_upto < 2000
            yield Progress(done=self.read_on_upto, total=2000, elapsed_s=1.0)

    def ask(self, question: str, settings: AskSettings, cancel: threading.Event) -> Iterator[Event]:
        self.asked.append((question, settings))
        if cancel.is_set():  # stopped before the answer began: the engine raises
            raise CancelledError("stopped", "")
        if (self.turns or self.read_on_upto) and not self.follow_ups_read_fast:
            yield from self._read_on(question, cancel, paced=False)  # a follow-up for which the rest is sooner than a fast reading
        else:
            self.unread = settings.read == "fast"
        yield self.pruned
        sent: list[str] = []
        for piece in self.answer:
            self._wait_turn(self.paced_answer)
            if cancel.is_set():  # stopped while answering: the engine ends the answer there
                break
            self.tokens_sent += 1
            sent.append(piece)
            yield Token(piece)
        self.turns += 1
        stop_reason = "cancelled" if cancel.is_set() else "end"
        yield Done("".join(sent), replace(fake_stats(settings, len(sent)), stop_reason=stop_reason), self.sources)

    def reset(self) -> None:
        self.resets += 1
        self.turns = 0

    def kept_spans(self, kept_positions: Iterable[int]) -> list[tuple[int, int]]:
        if self.pruned.kept_heads:
            return [SENTENCES[p] for p in sorted(kept_positions)]
        return [(13, 47)]

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeSessions:
    """Opens FakeSessions; `error` (a KvchatError) is raised on open instead."""

    error: KvchatError | None = None
    paced_reading: bool = False
    paced_answer: bool = False
    paced_reading_on: bool = False
    follow_ups_read_fast: bool = False
    foreground: Foreground | None = None
    answer: list[str] | None = None
    scanned_pages: int = 0  # pages an opened document "OCRs" before its reading
    sources: tuple[Source, ...] = ()
    pruned: Pruned = PRUNED
    opened: list[FakeSession] = field(default_factory=list)
    cancels: list[threading.Event | None] = field(default_factory=list)  # what each open() was stopped by
    closed: bool = False

    def open(
        self, paths: Sequence[Path], settings: AskSettings, ocr_progress: PageProgress | None = None,
        cancel: threading.Event | None = None,
    ) -> FakeSession:
        self.cancels.append(cancel)
        if self.error is not None:
            raise self.error
        for done in range(self.scanned_pages + 1) if self.scanned_pages and ocr_progress else ():
            ocr_progress(done, self.scanned_pages)
        document = bundle([Document(path=path, kind="text", text=DOCUMENT_TEXT, pages=[Page(1, 0, len(DOCUMENT_TEXT))])
                           for path in paths])
        session = FakeSession(document, self.paced_reading, self.paced_answer, sources=self.sources, pruned=self.pruned,
                              paced_reading_on=self.paced_reading_on, follow_ups_read_fast=self.follow_ups_read_fast,
                              foreground=self.foreground)
        if self.answer is not None:
            session.answer = list(self.answer)
        self.opened.append(session)
        return session

    def close(self) -> None:
        self.closed = True
