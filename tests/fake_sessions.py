"""A fake engine for the chat app's tests: scripted events, real timing, real cancellation."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvchat.documents import Document, Page
from kvchat.engine import AskSettings
from kvchat.errors import CancelledError, KvchatError
from kvchat.events import Done, Event, Notice, Progress, Pruned, Stats, Token

DOCUMENT_TEXT = "Field notes. The boat was named the Grey Heron. The radio failed on day four."
ANSWER = ["The boat ", "was named ", "the **Grey Heron**."]


def fake_stats(settings: AskSettings, generated: int) -> Stats:
    return Stats(
        model="fake", method=settings.method.name, budget=settings.method.budget, prompt_tokens=2000,
        loaded_tokens=0, kept_tokens=256, generated_tokens=generated, kv_bytes_full=2000 * 12288, kv_bytes_kept=256 * 12288,
        prefill_tokens_per_s=400.0, decode_tokens_per_s=25.0, ttft_s=0.5, total_s=1.0, peak_cells=2000,
        stop_reason="end",
    )


@dataclass
class FakeSession:
    document: Document
    token_delay_s: float = 0.0
    read_delay_s: float = 0.0
    answer: list[str] = field(default_factory=lambda: list(ANSWER))
    token_count: int = 2000
    asked: list[tuple[str, AskSettings]] = field(default_factory=list)
    turns: int = 0
    resets: int = 0
    closed: bool = False
    tokens_sent: int = 0

    def read(self, cancel: threading.Event) -> Iterator[Event]:
        for done in range(0, 2001, 500):
            if cancel.is_set():
                raise CancelledError("stopped", "")
            time.sleep(self.read_delay_s)
            yield Progress(done=done, total=2000, elapsed_s=done / 400)
        yield Notice("read notes.txt")

    def ask(self, question: str, settings: AskSettings, cancel: threading.Event) -> Iterator[Event]:
        self.asked.append((question, settings))
        if cancel.is_set():  # stopped before the answer began: the engine raises
            raise CancelledError("stopped", "")
        yield Pruned(prompt_tokens=2000, kept_tokens=256, kept_positions=tuple(range(256)))
        sent: list[str] = []
        for piece in self.answer:
            if cancel.is_set():  # stopped while answering: the engine ends the answer there
                break
            time.sleep(self.token_delay_s)
            self.tokens_sent += 1
            sent.append(piece)
            yield Token(piece)
        self.turns += 1
        stop_reason = "cancelled" if cancel.is_set() else "end"
        yield Done("".join(sent), replace(fake_stats(settings, len(sent)), stop_reason=stop_reason))

    def reset(self) -> None:
        self.resets += 1
        self.turns = 0

    def kept_spans(self, kept_positions: Iterable[int]) -> list[tuple[int, int]]:
        return [(13, 47)]

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeSessions:
    """Opens FakeSessions; `error` (a KvchatError) is raised on open instead."""

    error: KvchatError | None = None
    token_delay_s: float = 0.0
    read_delay_s: float = 0.0
    answer: list[str] | None = None
    opened: list[FakeSession] = field(default_factory=list)
    closed: bool = False

    def open(self, path: Path, settings: AskSettings) -> FakeSession:
        if self.error is not None:
            raise self.error
        document = Document(path=path, kind="text", text=DOCUMENT_TEXT, pages=[Page(1, 0, len(DOCUMENT_TEXT))])
        session = FakeSession(document, self.token_delay_s, self.read_delay_s)
        if self.answer is not None:
            session.answer = list(self.answer)
        self.opened.append(session)
        return session

    def close(self) -> None:
        self.closed = True
