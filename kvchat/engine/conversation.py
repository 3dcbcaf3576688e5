"""A conversation about one document: read (or load) it once, answer many questions.

Strategies for what each answer sees (`Selection`):
- "question": every question gets its own selection. The saved full state of the document is
  restored, earlier turns are pinned, the new question is the observation window. Right for
  follow-ups about other parts of the document (SnapKV's kept set is chosen for one question).
- "document": one query-agnostic selection per document, made with a generic question, reused
  for every question. Less work per turn; weaker on details the generic window did not see.
- "reuse": keep the first question's kept set and continue the chat on it, as a plain chat
  would. The baseline the other two are measured against.
With `--method snapstream` the document is streamed within the budget (see stream.py); the
streamed cache is what every question starts from.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Literal


from kvchat.documents import Document
from kvchat.engine.sizing import RING_MIN, context_size, round_up
from kvchat.engine.kept import kept_text_spans
from kvchat.engine.pipeline import plan_cells
from kvchat.engine.prompt import GENERIC_QUESTION, PromptPart, Turn, chat_messages, split_rendered, text_sha256
from kvchat.engine.prompt_run import PromptRun
from kvchat.engine.settings import AskSettings
from kvchat.engine.states import DocumentStates
from kvchat.engine.stream import StreamSettings, stream_context_size
from kvchat.events import Done, Event, Notice
from kvchat.llama import LlamaModel

Selection = Literal["question", "document", "reuse"]
SELECTIONS: tuple[str, ...] = ("question", "document", "reuse")
CONVERSATION_ROOM = 1024


class Conversation:
    """One document and the turns so far, on one context. Call open() before ask()."""

    def __init__(
        self,
        model: LlamaModel,
        model_name: str,
        document: Document,
        settings: AskSettings,
        selection: Selection = "question",
        states: DocumentStates | None = None,
        stream: StreamSettings | None = None,
    ) -> None:
        self.model = model
        self.model_name = model_name
        self.document = document
        self.settings = settings
        self.selection = selection
        self.states = None if settings.method.streams or states is None else states.for_settings(settings)
        self.stream = stream or StreamSettings()
        self.turns: list[Turn] = []
        document_part, _, _ = self._split("")
        self._document_part = document_part.text
        self.document_tokens = document_part.tokens(model)
        if settings.method.needs_spans:  # token texts for span-aware selection, prepared with the tokens
            model.pieces_text(self.document_tokens)
        self.document_sha256 = text_sha256(document_part.text)
        self.run = PromptRun(model, self._context_size(), settings, model_name)
        self._agnostic: tuple | None = None
        self._previous_tokens: list[int] = []
        self.prompt_tokens: list[int] = []
        self._reading_s = 0.0

    def _context_size(self) -> int:
        if self.settings.method.streams:
            return stream_context_size(self.settings, self.stream, 64, self.model.shape.n_ctx_train)
        reserve = CONVERSATION_ROOM + self.settings.max_tokens
        return context_size(self.model, len(self.document_tokens), self.settings, reserve)

    def _split(self, question: str) -> tuple[PromptPart, PromptPart, PromptPart]:
        messages = chat_messages(self.document.text, self.turns, question)
        return split_rendered(self.model.apply_chat_template(messages))

    def _question_window(self, question: str) -> list[int]:
        _, _, question_part = self._split(question)
        return question_part.tokens(self.model)[-self.settings.method.window :]

    def open(self, cancel: threading.Event | None = None, question: str | None = None) -> Iterator[Event]:
        """Read the document (streamed, loaded from a saved state, or in full) and keep it.

        `question`, when known, observes a streamed reading (query-aware streaming).
        """
        if self.settings.method.streams:
            observer = self._question_window(question) if question and self.stream.query_aware else None
            yield from self.run.stream(self.document_tokens, observer, self.settings, self.stream, cancel)
            self.run.save()
            self._reading_s = self.run.read_s
            return
        loaded = yield from self._load_saved()
        if not loaded:
            yield from self.run.read(self.document_tokens, len(self.document_tokens), cancel)
            state = self.run.save()
            if self.states is not None:
                yield from self.states.save(self.document_sha256, len(self.document_tokens), state, str(self.document.path))
        if self.selection == "document":
            self._select_for_document()
        self._reading_s = self.run.read_s

    def _load_saved(self) -> Iterator[Event]:
        if self.states is None:
            return False
        started = time.perf_counter()
        if not (yield from self.run.load_saved(self.states, self.document_sha256, self.document_tokens, started)):
            return False
        yield Notice(f"loaded the saved reading of {self.document.path.name} ({len(self.document_tokens):,} tokens)")
        return True

    def _select_for_document(self) -> None:
        """Query-agnostic selection: a generic question observes; keep the choice for every turn."""
        cache = self.run.cache
        self.run.mark_changed()
        votes = cache.observe(self._question_window(GENERIC_QUESTION), keep=False)
        # the document's last token stands in the window
        cache.keep_cells(plan_cells(self.model, self.settings.method, 1, votes, cache).kept)
        self._agnostic = self.run.snapshot()

    def ask(
        self, question: str, cancel: threading.Event | None = None, settings: AskSettings | None = None
    ) -> Iterator[Event]:
        """Answer `question` in the light of the turns so far; the turn is recorded when done.

        `settings` overrides the conversation's for this answer (the bench compares methods so).
        """
        settings = settings or self.settings
        selected = yield from self.prepare(question, cancel, settings)
        done: Done | None = None
        for event in self.run.answer(settings, selected, cancel):
            if isinstance(event, Done):
                done = event
            yield event
        if done is not None:
            self.turns.append(Turn(question, done.answer))

    def prepare(self, question: str, cancel: threading.Event | None, settings: AskSettings) -> Iterator[Event]:
        """Everything of ask() but the answer: the run's cache then holds the kept prompt and the
        last token's logits (the server moves it to a sequence of its own); `self.prompt_tokens`
        is the whole prompt. Returns the run's Selected, for its answer."""
        _, earlier, question_part = self._split(question)
        earlier_tokens = earlier.tokens(self.model)
        tokens = self.document_tokens + earlier_tokens + question_part.tokens(self.model)
        n_pinned, prune = self._prepare(tokens, len(earlier_tokens))
        self._make_room(len(tokens) - self.run.read_upto, settings.max_tokens)
        # the document's reading counts towards the first answer's TTFT, not the follow-ups'
        reading_s = 0.0 if self.turns else self._reading_s
        selected = yield from self.run.select(tokens, settings, n_pinned, cancel, prune, reading_s)
        self._previous_tokens = self.prompt_tokens = tokens
        return selected

    def _make_room(self, new_tokens: int, max_tokens: int) -> None:
        """Grow the context when the conversation no longer fits (the answer may use the ring)."""
        needed = self.run.cache.cells + new_tokens + RING_MIN
        if needed > self.run.n_ctx:
            limit = max(self.model.shape.n_ctx_train, needed)
            self.run.grow(min(round_up(needed + max_tokens), round_up(limit)))

    def _prepare(self, tokens: list[int], n_earlier: int) -> tuple[int, bool]:
        """Put the cache in the state this selection answers from; how many tokens to pin, and
        whether the question selects again (the "document" and "reuse" selections chose before)."""
        if self.selection == "document" and self._agnostic is not None:
            self.run.restore(self._agnostic)
            return 0, False
        if self.selection == "reuse" and self.turns:
            self.run.keep_prefix(tokens, self._previous_tokens)
            return 0, False
        self.run.restore()
        return n_earlier, True

    def kept_spans(self, kept_positions: Iterable[int]) -> list[tuple[int, int]]:
        """Character ranges of the document's text (stripped, as the model saw it) that the
        cells at `kept_positions` hold: what a selection kept, for showing to the user."""
        return kept_text_spans(
            self.model, self._document_part, self.document.text.strip(), self.document_tokens, kept_positions
        )

    def reset(self) -> None:
        """Start a new conversation about the same document."""
        self.turns = []

    def resume(self, turns: Iterable[Turn]) -> None:
        """Continue a conversation held elsewhere (the server's client sends its turns back)."""
        self.turns = list(turns)

    def close(self) -> None:
        self.run.close()
