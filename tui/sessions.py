"""What the chat app needs from the engine, as a small interface the tests can fake.

A `SessionFactory` opens documents (loading the model on first use); a `ChatSession` is one
document and its conversation. Both are called from worker threads, never the UI thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from kvchat.documents import Document, PageProgress, bundle, load_document
from kvchat.engine import AskSettings, Conversation, Engine
from kvchat.events import Event


class ChatSession(Protocol):
    document: Document
    token_count: int  # the document part of the prompt, in tokens

    @property
    def unread(self) -> bool:
        """Only a fast reading answered so far: the document is still to be read for the follow-ups."""

    def read(self, cancel: threading.Event) -> Iterator[Event]:
        """Read (or load the saved reading of) the document."""

    def read_on(self, cancel: threading.Event, paused: Callable[[bool], None]) -> Iterator[Event]:
        """After a fast answer, read the whole document; stopped, the next call or question goes
        on from there. It waits while another kvchat process answers a question (its batch under way
        stops part-way), calling `paused(True)` as the wait begins and `paused(False)` as it ends."""

    def ask(self, question: str, settings: AskSettings, cancel: threading.Event) -> Iterator[Event]:
        """Answer one question, in the light of the turns so far."""

    def reset(self) -> None:
        """Forget the turns; keep the document's reading."""

    def kept_spans(self, kept_positions: Iterable[int]) -> list[tuple[int, int]]:
        """Character ranges of the document text that the kept cache entries hold."""

    def close(self) -> None: ...


class SessionFactory(Protocol):
    def open(
        self, paths: Sequence[Path], settings: AskSettings, ocr_progress: PageProgress | None = None,
        cancel: threading.Event | None = None,
    ) -> ChatSession:
        """Load the documents (raises KvchatError with a hint; `ocr_progress` follows the OCR of
        scanned pages, which stops with CancelledError once `cancel` is set) and start a
        conversation about them together."""

    def close(self) -> None: ...


class EngineSession:
    """A ChatSession on a real engine conversation."""

    def __init__(self, engine: Engine, conversation: Conversation) -> None:
        self.engine = engine
        self.conversation = conversation
        self.document = conversation.document
        self.token_count = len(conversation.document_tokens)

    @property
    def unread(self) -> bool:
        return self.conversation.unread

    def read(self, cancel: threading.Event) -> Iterator[Event]:
        return self.conversation.open(cancel=cancel)

    def read_on(self, cancel: threading.Event, paused: Callable[[bool], None]) -> Iterator[Event]:
        return self.engine.foreground.giving_way(self.conversation.read_on(cancel), cancel, paused)

    def ask(self, question: str, settings: AskSettings, cancel: threading.Event) -> Iterator[Event]:
        return self.engine.answer(self.conversation, question, settings, cancel=cancel)

    def reset(self) -> None:
        self.conversation.reset()

    def kept_spans(self, kept_positions: Iterable[int]) -> list[tuple[int, int]]:
        return self.conversation.kept_spans(kept_positions)

    def close(self) -> None:
        self.conversation.close()


class EngineSessionFactory:
    """Opens documents on one Engine, created when the first document is opened."""

    def __init__(self, model: str = "default", gpu_layers: int = 0, use_cache: bool = True, draft: str | None = None,
                 draft_at_start: bool = True) -> None:
        self.model = model
        self.draft, self.draft_at_start = draft, draft_at_start
        self.gpu_layers = gpu_layers
        self.use_cache = use_cache
        self._engine: Engine | None = None

    def open(
        self, paths: Sequence[Path], settings: AskSettings, ocr_progress: PageProgress | None = None,
        cancel: threading.Event | None = None,
    ) -> ChatSession:
        document = bundle([load_document(path, ocr_progress, cancel) for path in paths])
        if self._engine is None:
            self._engine = Engine(self.model, gpu_layers=self.gpu_layers, use_cache=self.use_cache, draft=self.draft,
                                  draft_at_start=self.draft_at_start)
        return EngineSession(self._engine, self._engine.conversation(document, settings))

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
