"""The Engine: one loaded model shared by every conversation and ask of a front end."""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from kvchat.documents import Document
from kvchat.engine.answering import route
from kvchat.engine.answering.elsewhere import PreparedPrompt, answer_sources, prepare_chat
from kvchat.engine.conversation import Conversation
from kvchat.engine.drafts import Draft
from kvchat.engine.kvcache.in_progress import ReadingsInProgress, WholeReadingDone
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.kvcache.store import DEFAULT_MAX_BYTES, StateStore
from kvchat.engine.reading.cheap_pass import CheapPass
from kvchat.engine.reading.plan import ReadingPlan, reading_plan
from kvchat.engine.reading.speeds import ReadingSpeeds
from kvchat.engine.reading.ways.registry import reading_of
from kvchat.engine.selections import PerQuestion
from kvchat.engine.settings import AskSettings
from kvchat.engine.text.document_text import PreparedDocument, PreparedDocuments
from kvchat.events import Done, Event, LaterReading, Notice, Source
from kvchat.errors import SettingsError
from kvchat.llama import LlamaModel, Sampler
from kvchat.models import cheap_depth, model_sha256, resolve_model
from kvchat.paths import cache_dir, checked_writable

PART_MAX_BYTES = 2**30  # the parts' readings: 18 parts of 2,048 tokens of the default model (57 MB each)


def state_store(max_bytes: int = DEFAULT_MAX_BYTES) -> StateStore:
    """The store of saved document readings under the user's cache directory."""
    return StateStore(cache_dir() / "states", max_bytes)


def part_store() -> StateStore:
    """The readings of the parts a whole-document question was answered from (in_parts.py): a
    store of their own, with a cap of their own, so that one such question about a long document
    evicts only parts, never a reading `kvchat read` (or an ask) saved."""
    return StateStore(cache_dir() / "part-states", PART_MAX_BYTES)


def readings_in_progress() -> ReadingsInProgress:
    """The whole readings other kvchat processes are doing (kvcache/in_progress.py)."""
    return ReadingsInProgress(cache_dir() / "reading")


class Engine:
    """Load a model once (by registry name or GGUF path); talk about documents with it.

    `use_cache` saves each document's reading and loads it on the next question, and remembers
    how fast the model reads here (for plan()); without it nothing is written to the cache. With
    it, a cache folder that cannot be written in is refused at once (paths.HomeError).
    `draft` (a name or GGUF path) is a smaller model with the same vocabulary that does the cheap
    pass of fast readings: loaded at start, or with `draft_at_start` False the first time a cheap
    pass needs it (drafts.Draft).
    """

    def __init__(self, model: str = "default", gpu_layers: int = 0, use_cache: bool = True, draft: str | None = None,
                 draft_at_start: bool = True) -> None:
        self.model_name = model
        if use_cache:  # said before the model loads, not when the first reading cannot be saved
            checked_writable(cache_dir())
        self.model_path: Path = resolve_model(model)
        draft_path = resolve_model(draft) if draft is not None else None  # a missing one is refused first
        self.model = LlamaModel(self.model_path, gpu_layers=gpu_layers)
        # who does a fast reading's cheap pass, and how deep: looked up once
        if draft is None or draft_path is None:
            self.cheap_pass = CheapPass(cheap_depth(model))
        else:
            draft_model = Draft(draft, draft_path, self.model, gpu_layers)
            self.cheap_pass = CheapPass(cheap_depth(draft), draft_model)
            if draft_at_start:
                draft_model.model()
        self.states: DocumentStates | None = None
        self.part_states: DocumentStates | None = None
        self.speeds: ReadingSpeeds | None = None
        if use_cache:  # what names the model in the cache: computed (and its memo written) only for it
            model_sha = model_sha256(self.model_path)
            self.states = DocumentStates(state_store(), model_sha, model)
            self.part_states = DocumentStates(part_store(), model_sha, model)
            self.speeds = ReadingSpeeds(cache_dir() / "reading-speeds.json", f"{model_sha}|gpu_layers={gpu_layers}")
        self.in_progress = readings_in_progress()
        self.foreground = self.in_progress.foreground  # the questions answered now: background readings pause for them
        self.prepared = PreparedDocuments(self.model)

    def conversation(
        self,
        document: Document,
        settings: AskSettings | None = None,
        *,
        saves: bool = True,
    ) -> Conversation:
        """A conversation about `document`, asked about through answer() (which opens it unless it
        is open). The settings choose the reading. `saves` False: its reading is not saved (a document made for one answer)."""
        settings = settings or AskSettings()
        return self._conversation(document, settings, self.states if saves else None, self.prepared(document, settings.system))

    def conversation_for_part(self, document: Document, settings: AskSettings, saves: bool) -> Conversation:
        """A conversation about a part of a document (answering/in_parts.py), its reading saved with
        the parts'. Its one question selects from the whole part, whatever `select` says."""
        return self._conversation(document, replace(settings, select=PerQuestion.name), self.part_states if saves else None)

    def _conversation(
        self, document: Document, settings: AskSettings, states: DocumentStates | None, prepared: PreparedDocument | None = None,
    ) -> Conversation:
        return Conversation(self.model, self.model_name, document, settings, states=states,
                            in_progress=self.in_progress if states is not None else None, speeds=self.speeds,
                            cheap_pass=self.cheap_pass, prepared=prepared)

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
    ) -> Iterator[Event]:
        """Stream events for one question about `document` (answer() on a new conversation):
        Progress…, Notice?, Evicted…, Pruned?, Token…, Done. A question about the whole document
        is answered from its parts, each read whole: `select`, `chunk` and `recent` play no part in it."""
        conversation = self.conversation(document, settings)
        try:
            yield from self.answer(conversation, question, cancel=cancel)
        finally:
            conversation.close()

    def answer(
        self, conversation: Conversation, question: str, settings: AskSettings | None = None, *,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """`question`'s answer on `conversation`, its sources and what to read after it
        (answering/route.py); `settings` override the conversation's for this answer."""
        return route.answer(conversation, question, settings, cancel=cancel, parts=self.conversation_for_part,
                            foreground=self.foreground)

    def prepare(
        self, conversation: Conversation, question: str, settings: AskSettings, sampler: Sampler, cancel: threading.Event,
    ) -> Generator[Event, None, Done | PreparedPrompt]:
        """As answer(), to the answer's first token, for an answer decoded in the server's shared
        batch (route.prepare): the PreparedPrompt, or the Done of a question answered in parts."""
        return route.prepare(conversation, question, settings, sampler, cancel, parts=self.conversation_for_part)

    def prepare_chat(
        self, messages: Sequence[dict[str, str]], settings: AskSettings, sampler: Sampler, cancel: threading.Event,
    ) -> Generator[Event, None, PreparedPrompt]:
        """As prepare(), for a chat of messages as the client sent it (answering/elsewhere.py)."""
        return prepare_chat(self.model, self.model_name, self.states, messages, settings, sampler, cancel)

    def answer_sources(
        self, prompt: PreparedPrompt, answer_tokens: list[int],
    ) -> tuple[tuple[Source, ...], tuple[float, ...], Notice | None]:
        """The sources of an answer decoded elsewhere to `prompt`, or the Notice that they could not
        be found (answering/elsewhere.py)."""
        return answer_sources(self.model, prompt, answer_tokens)

    def read_whole(
        self, document: Document, settings: AskSettings | None = None, cancel: threading.Event | None = None,
        *, in_turn: bool = False, stoppable: bool = False,
    ) -> Generator[Event, None, WholeReadingDone]:
        """Read `document` whole and save the reading (`kvchat read`, a fast first answer's
        reading finished in the background, the server's), unless it is saved or another process
        reads it: the reading's lock is held while it is read (Conversation.read_whole).
        `in_turn`: wait for the background readings' turn first; `stoppable`: this process turns
        SIGTERM into stopping (`kvchat cache stop` may ask it). Needs the engine's store (use_cache)."""
        if self.states is None:
            raise SettingsError("reading a document to save it needs the saved readings", "leave `cache` on")
        conversation = self.conversation(document, replace(settings or AskSettings(), read="full"))
        try:
            return (yield from conversation.read_whole(cancel, in_turn=in_turn, stoppable=stoppable))
        finally:
            conversation.close()

    def later_reading(self, document: Document, settings: AskSettings) -> LaterReading | None:
        """What `document` asked about with `settings` is read as after its first answer, for the
        questions after (Done.read_later): as the way of reading its conversation takes says
        (registry.reading_of, by the tokens of its prompt: its passages by default, and where it
        is too long to read whole; whole; None for retrieval)."""
        tokens = self.prepared(document, settings.system).tokens  # its first question's conversation prepared already
        return reading_of(self.model, len(tokens), settings, self.cheap_pass.drafted)[2].later

    def read_later(
        self, document: Document, settings: AskSettings, later: LaterReading, cancel: threading.Event | None = None,
        *, in_turn: bool = False, stoppable: bool = False,
    ) -> Generator[Event, None, WholeReadingDone]:
        """Read `document` as `later` says (its passage bank, or whole: Done.read_later) and save
        that, unless it is saved or another process reads it: a fast first answer's reading finished
        in the background, the server's reading of an upload."""
        if later is not LaterReading.PASSAGES:
            return (yield from self.read_whole(document, settings, cancel, in_turn=in_turn, stoppable=stoppable))
        if self.states is None:
            raise SettingsError("reading a document to save it needs the saved readings", "leave `cache` on")
        # A conversation whose questions read their passages (retrieval's), whatever the first answer's
        # way was: one too long to read whole is then not made to read streamed (sizing.reading_settings).
        conversation = self.conversation(document, replace(settings, read="retrieval"))
        try:
            return (yield from conversation.read_passages(cancel, in_turn=in_turn, stoppable=stoppable))
        finally:
            conversation.close()

    def close(self) -> None:
        if self.cheap_pass.draft is not None:
            self.cheap_pass.draft.close()
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

