"""A chat request's prompt, read (or loaded) and pruned on a context of its own, ready to be moved
into a sequence of the shared context (slots.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from kvchat.documents import Document
from kvchat.engine.conversation import Conversation
from kvchat.engine.prompt import Turn
from kvchat.engine.run import PromptRun
from kvchat.engine.settings import AskSettings
from kvchat.engine.sizing import context_size
from kvchat.engine.states import DocumentStates
from kvchat.errors import SettingsError
from kvchat.events import Event
from kvchat.llama import LlamaModel, StateBytes


@dataclass(frozen=True)
class ChatRequest:
    """What to answer: about `document` (its saved reading is reused; earlier `turns` are pinned
    and the question observes), or a plain chat of `messages` in the model's own template."""

    settings: AskSettings
    document: Document | None = None
    turns: tuple[Turn, ...] = ()
    question: str = ""
    messages: tuple[dict[str, str], ...] = field(default=())


@dataclass
class PreparedPrompt:
    state: StateBytes  # the kept cells, as a one-sequence state
    positions: np.ndarray  # their positions; the last one is the prompt's last token
    last_token: int
    prompt_tokens: int
    read_s: float


def prepare(
    model: LlamaModel, model_name: str, states: DocumentStates | None, request: ChatRequest, cancel: threading.Event
) -> Iterator[Event]:
    """Events while reading and pruning; returns a PreparedPrompt."""
    if request.document is not None:
        return (yield from _prepare_document(model, model_name, states, request, cancel))
    return (yield from _prepare_messages(model, model_name, request, cancel))


def _prepare_document(
    model: LlamaModel, model_name: str, states: DocumentStates | None, request: ChatRequest, cancel: threading.Event
) -> Iterator[Event]:
    assert request.document is not None
    conversation = Conversation(model, model_name, request.document, request.settings, "question", states)
    try:
        conversation.turns = list(request.turns)
        yield from conversation.open(cancel)
        yield from conversation.prepare(request.question, cancel, request.settings)
        return _taken(conversation.run, len(conversation.prompt_tokens))
    finally:
        conversation.close()


def _prepare_messages(model: LlamaModel, model_name: str, request: ChatRequest, cancel: threading.Event) -> Iterator[Event]:
    if not request.messages:
        raise SettingsError("the request has no messages", "send at least one user message")
    tokens = model.tokenize(model.apply_chat_template(list(request.messages)))
    settings = request.settings
    with PromptRun(model, context_size(model, len(tokens), settings, 64), settings, model_name) as run:
        yield from run.read(tokens, max(len(tokens) - settings.policy.window, 0), cancel)
        yield from run.select(tokens, settings, 0, cancel)
        return _taken(run, len(tokens))


def _taken(run: PromptRun, prompt_tokens: int) -> PreparedPrompt:
    cache = run.cache
    return PreparedPrompt(cache.state(), cache.positions.copy(), int(cache.tokens[-1]), prompt_tokens, run.read_s)
