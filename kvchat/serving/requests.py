"""A chat request, and its prompt prepared (read and selected) on a context of its own, ready to be
moved into a sequence of the shared context (slots.py): through the engine's prepare_question or
prepare_chat."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvchat.documents import Document
from kvchat.engine import AskSettings, Engine, Turn, prepare_chat, prepare_question
from kvchat.events import Event
from kvchat.llama import Sampler


@dataclass(frozen=True)
class ChatRequest:
    """What to answer: about `document` (its saved reading is reused; earlier `turns` are pinned
    and the question observes), or a plain chat of `messages` in the model's own template."""

    settings: AskSettings
    document: Document | None = None
    turns: tuple[Turn, ...] = ()
    question: str = ""
    messages: tuple[dict[str, str], ...] = field(default=())


def prepare(engine: Engine, request: ChatRequest, cancel: threading.Event, sampler: Sampler) -> Iterator[Event]:
    """Events while reading and pruning `request`; returns its PreparedPrompt (or AnsweredInParts)."""
    if request.document is not None:
        return (yield from prepare_question(engine, request.document, request.turns, request.question, request.settings,
                                            cancel, sampler))
    return (yield from prepare_chat(engine, request.messages, request.settings, cancel, sampler))
