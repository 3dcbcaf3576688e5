"""A conversation about one document: read (or load) it once, answer many questions.

Strategies for what each answer sees (`Selection`):
- "question": every question gets its own selection. The saved full state of the document is
  restored, earlier turns are pinned, the new question is the observation window. Right for
  follow-ups about other parts of the document (SnapKV's kept set is chosen for one question).
- "document": one query-agnostic selection per document, made with a generic question, reused
  for every question. Less work per turn; weaker on details the generic window did not see.
- "reuse": keep the first question's kept set and continue the chat on it, as a plain chat
  would. The baseline the other two are measured against.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Literal

import numpy as np

from kvchat.documents import Document
from kvchat.engine.ask import context_size, round_up
from kvchat.engine.pipeline import apply_plan, observe, plan_prune
from kvchat.engine.prompt import GENERIC_QUESTION, Turn, chat_messages, split_rendered, text_sha256
from kvchat.engine.run import PromptRun
from kvchat.engine.settings import AskSettings
from kvchat.engine.states import DocumentStates
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
    ) -> None:
        self.model = model
        self.model_name = model_name
        self.document = document
        self.settings = settings
        self.selection = selection
        self.states = states
        self.turns: list[Turn] = []
        document_part, _, _ = self._split("")
        self.document_tokens = model.tokenize(document_part)
        self.document_sha256 = text_sha256(document_part)
        reserve = CONVERSATION_ROOM + settings.max_tokens
        self.run = PromptRun(model, context_size(model, len(self.document_tokens), settings, reserve), settings, model_name)
        self._agnostic: tuple[bytes, int] | None = None
        self._previous_tokens: list[int] = []

    def _split(self, question: str) -> tuple[str, str, str]:
        messages = chat_messages(self.document.text, self.turns, question)
        return split_rendered(self.model.apply_chat_template(messages))

    def open(self, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Read the document, or load its saved state; then save it for next time."""
        n_document = len(self.document_tokens)
        loaded = yield from self._load_saved()
        if not loaded:
            yield from self.run.read(self.document_tokens, n_document, cancel)
            state = self.run.save()
            if self.states is not None:
                yield from self.states.save(self.document_sha256, n_document, state, self.document)
        if self.selection == "document":
            self._select_for_document()

    def _load_saved(self) -> Iterator[Event]:
        if self.states is None:
            return False
        found = yield from self.states.load(self.document_sha256, len(self.document_tokens))
        if found is None:
            return False
        self.run.load(found, len(self.document_tokens))
        yield Notice(f"loaded the saved reading of {self.document.path.name} ({len(self.document_tokens):,} tokens)")
        return True

    def _select_for_document(self) -> None:
        """Query-agnostic selection: a generic question observes; keep the choice for every turn."""
        _, _, generic_part = self._split(GENERIC_QUESTION)
        window = self.model.tokenize(generic_part)[-self.settings.policy.window :]
        n_document = len(self.document_tokens)
        votes = observe(self.run.ctx, window, n_document)[..., :n_document]
        pieces = self.model.pieces_text(self.document_tokens) if self.settings.policy.spans else None
        policy = replace(self.settings.policy, window=1)  # the document's last token stands in the window
        plan = plan_prune(policy, votes, pieces)
        self.run.ctx.remove(0, n_document, -1)
        apply_plan(self.run.ctx, plan)
        self._agnostic = (self.run.ctx.state_bytes(), plan.n_kept)

    def ask(
        self, question: str, cancel: threading.Event | None = None, settings: AskSettings | None = None
    ) -> Iterator[Event]:
        """Answer `question` in the light of the turns so far; the turn is recorded when done.

        `settings` overrides the conversation's for this answer (the bench compares methods so).
        """
        settings = settings or self.settings
        _, earlier, question_part = self._split(question)
        earlier_tokens = self.model.tokenize(earlier) if earlier else []
        tokens = self.document_tokens + earlier_tokens + self.model.tokenize(question_part)
        self.run.grow(round_up(len(tokens) + settings.max_tokens))
        settings, pins = self._prepare(tokens, len(earlier_tokens), settings)
        done: Done | None = None
        for event in self.run.finish(tokens, settings, pins=pins, cancel=cancel):
            if isinstance(event, Done):
                done = event
            yield event
        if done is not None:
            self.turns.append(Turn(question, done.answer))
        self._previous_tokens = tokens

    def _prepare(
        self, tokens: list[int], n_earlier: int, settings: AskSettings
    ) -> tuple[AskSettings, np.ndarray | None]:
        """Put the cache in the state this selection answers from; pins for earlier turns."""
        n_document = len(self.document_tokens)
        if self.selection == "document" and self._agnostic is not None:
            self.run.load(self._agnostic[0], n_document, cells=self._agnostic[1], keep=False)
            return replace(settings, method="full"), None
        if self.selection == "reuse" and self.turns:
            self.run.keep_prefix(tokens, self._previous_tokens, self.run.last_generated)
            return replace(settings, method="full"), None
        self.run.restore()
        pins = np.zeros(len(tokens), dtype=bool)
        pins[n_document : n_document + n_earlier] = True
        return settings, pins

    def reset(self) -> None:
        """Start a new conversation about the same document."""
        self.turns = []

    def close(self) -> None:
        self.run.close()
