"""The Engine: one loaded model shared by every conversation and ask of a front end."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import nullcontext
from dataclasses import replace
from enum import Enum
from pathlib import Path

from kvchat.documents import Document
from kvchat.engine.conversation import Conversation
from kvchat.engine.in_parts import answer_in_parts
from kvchat.engine.kvcache.in_progress import Claim, ReadingsInProgress
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.kvcache.store import DEFAULT_MAX_BYTES, StateStore
from kvchat.engine.reading.fast import CheapPass
from kvchat.engine.reading.plan import ReadingPlan, reading_plan
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.engine.reading.stream import StreamSettings
from kvchat.engine.reading.way import Reading
from kvchat.engine.selections import PerQuestion, Selection
from kvchat.engine.settings import AskSettings
from kvchat.errors import SettingsError, raise_if_cancelled
from kvchat.events import Event, Notice, Progress
from kvchat.llama import LlamaModel
from kvchat.models import cheap_depth, model_sha256, resolve_model
from kvchat.paths import cache_dir


WAITING_FOR_TURN = "waiting for the background reading before it to end"  # read_whole(in_turn=True)'s notice


def state_store(max_bytes: int = DEFAULT_MAX_BYTES) -> StateStore:
    """The store of saved document readings under the user's cache directory."""
    return StateStore(cache_dir() / "states", max_bytes)


def readings_in_progress() -> ReadingsInProgress:
    """The whole readings other kvchat processes are doing (kvcache/in_progress.py)."""
    return ReadingsInProgress(cache_dir() / "reading")


class WholeReadingDone(Enum):
    """How Engine.read_whole ended."""

    READ = "read"  # read and saved
    SAVED = "already saved"
    STREAMED = "too long for the model's context: read streamed for each question, never saved"


class Engine:
    """Load a model once (by registry name or GGUF path); talk about documents with it.

    `use_cache` saves each document's reading and loads it on the next question, and remembers
    how fast the model reads here (for plan()); without it nothing is written to the cache.
    `draft` (a name or GGUF path) is a smaller model with the same vocabulary that does the cheap
    pass of fast readings.
    """

    def __init__(self, model: str = "default", gpu_layers: int = 0, use_cache: bool = True, draft: str | None = None) -> None:
        self.model_name = model
        self.model_path: Path = resolve_model(model)
        draft_path = resolve_model(draft) if draft is not None else None  # a missing one is refused first
        self.model = LlamaModel(self.model_path, gpu_layers=gpu_layers)
        # who does a fast reading's cheap pass, and how deep: looked up once
        self.cheap_pass = _draft(self.model, draft, draft_path, gpu_layers) if draft_path is not None else CheapPass(cheap_depth(model))
        model_sha = model_sha256(self.model_path)
        self.states = DocumentStates(state_store(), model_sha, model) if use_cache else None
        speeds_path, speeds_key = cache_dir() / "reading-speeds.json", f"{model_sha}|gpu_layers={gpu_layers}"
        self.speeds = ReadingSpeeds(speeds_path, speeds_key) if use_cache else None
        self.in_progress = readings_in_progress()

    def conversation(
        self,
        document: Document,
        settings: AskSettings | None = None,
        *,
        selection: Selection = PerQuestion(),
        stream: StreamSettings | None = None,
        reading: Reading | None = None,
        decode_all: bool = False,
        saves: bool = True,
    ) -> Conversation:
        """A conversation about `document`; call open() on it before asking. `reading` and
        `decode_all` are the bench's (see Conversation); by default the settings choose the reading.
        `saves` False: its reading is not saved (a document made for one answer)."""
        settings = settings or AskSettings()
        states = self.states if saves else None
        return Conversation(self.model, self.model_name, document, settings, selection=selection, states=states,
                            stream=stream, speeds=self.speeds, cheap_pass=self.cheap_pass, reading=reading,
                            decode_all=decode_all)

    def plan(self, document: Document, settings: AskSettings | None = None) -> ReadingPlan:
        """How `document` would be read with `settings`, and how long that would take here."""
        return reading_plan(self.model, document, settings or AskSettings(), self.speeds, self.cheap_pass.drafted)

    def ask(
        self,
        document: Document,
        question: str,
        settings: AskSettings | None = None,
        *,
        cancel: threading.Event | None = None,
        selection: Selection = PerQuestion(),
        stream: StreamSettings | None = None,
    ) -> Iterator[Event]:
        """Stream events for one question: Progress…, Notice?, Evicted…, Pruned?, Token…, Done. A
        question about the whole document (settings.whole) is answered from its parts (in_parts.py)."""
        if settings is not None and settings.whole is not None:
            conversation_for = lambda part, part_settings, saves: self.conversation(part, part_settings, saves=saves)  # noqa: E731
            yield from answer_in_parts(conversation_for, document, question, settings, self.model.count_tokens, cancel)
            return
        conversation = self.conversation(document, settings, selection=selection, stream=stream)
        try:
            yield from conversation.open(question, cancel=cancel)
            yield from conversation.ask(question, cancel=cancel)
        finally:
            conversation.close()

    def read_whole(
        self, document: Document, settings: AskSettings | None = None, cancel: threading.Event | None = None,
        *, in_turn: bool = False,
    ) -> Generator[Event, None, WholeReadingDone]:
        """Read `document` whole and save the reading (`kvchat read`, and a fast first answer's
        reading finished in the background), unless it is saved or another process reads it:
        the reading's lock (kvcache/in_progress.py) is held while it is read, so no two processes
        read one document at once. `in_turn`: wait for the background readings' turn first (one
        reads at a time). Needs the engine's store (use_cache)."""
        if self.states is None:
            raise SettingsError("reading a document to save it needs the saved readings", "leave `cache` on")
        conversation = self.conversation(document, replace(settings or AskSettings(), read="full"))
        try:
            key = conversation.reading_key
            if key is None:
                return WholeReadingDone.STREAMED
            return (yield from self._alone(conversation, key, cancel, lambda: conversation.open(cancel=cancel), in_turn))
        finally:
            conversation.close()

    def read_on(self, conversation: Conversation, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Conversation.read_on (the chat app's reading after a fast answer) under the reading's
        lock, as read_whole: a reading of the document that another process is doing is waited
        for and then loaded."""
        key = conversation.reading_key if conversation.unread else None
        if key is not None:
            yield from self._alone(conversation, key, cancel, lambda: conversation.read_on(cancel))
        yield from conversation.read_on(cancel)  # loads the reading another process saved (nothing if read here)

    def _alone(
        self, conversation: Conversation, key: str, cancel: threading.Event | None, read: Callable[[], Iterator[Event]],
        in_turn: bool = False,
    ) -> Generator[Event, None, WholeReadingDone]:
        """`read()` the conversation's document holding its reading's lock, unless the reading is
        saved; while another process holds the lock, follow its progress and look again."""
        while (claim := self._claim(conversation, key)) is None:  # another process reads it: wait for it
            yield Notice(f"another kvchat process is reading {conversation.document.path}; waiting for it")
            yield from self.follow_reading(key, cancel)
            raise_if_cancelled(cancel)
        if claim is WholeReadingDone.SAVED:
            return WholeReadingDone.SAVED
        with claim, self.in_progress.turn() if in_turn else nullcontext() as turn:
            if turn is not None and not turn.take():
                yield Notice(WAITING_FOR_TURN)
                claim.queued(True)
                turn.wait(cancel)
                claim.queued(False)
            for event in read():
                if isinstance(event, Progress):
                    claim.progress(event.done, event.total)
                yield event
        return WholeReadingDone.READ

    def _claim(self, conversation: Conversation, key: str) -> Claim | WholeReadingDone | None:
        """The lock of the conversation's reading, SAVED if it is saved, None if another process reads it."""
        if conversation.saved:
            return WholeReadingDone.SAVED
        claim = self.in_progress.claim(key, str(conversation.document.path), self.model_name, len(conversation.document_tokens))
        if claim is not None and conversation.saved:  # saved just before the lock was taken
            claim.release()
            return WholeReadingDone.SAVED
        return claim

    def follow_reading(self, key: str, cancel: threading.Event | None = None) -> Iterator[Progress]:
        """The progress of another process's reading of `key` (its reading_key), until it ends."""
        for record in self.in_progress.follow(key, cancel):
            yield Progress(done=record.done, total=record.total, elapsed_s=record.updated - record.started)

    def close(self) -> None:
        if self.cheap_pass.draft is not None:
            self.cheap_pass.draft.close()
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _draft(model: LlamaModel, name: str, path: Path, gpu_layers: int) -> CheapPass:
    """The draft model loaded, once it is known to share the model's vocabulary."""
    draft = LlamaModel(path, gpu_layers=gpu_layers)
    if not model.same_vocabulary(draft):
        draft.close()
        raise SettingsError(f"the draft model {name} has another vocabulary than the model",
                            "use a smaller model of the same family (the default model's draft is small)")
    return CheapPass(cheap_depth(name), draft, name)
