"""A request's prompt prepared (read and selected) on a context of its own, ready to be moved into
a sequence of the shared context (slots.py): through the engine's answering route (Engine.prepare:
a question about a document, its conversation resumed from the turns the client sent back; the
saved reading is loaded, the earlier turns pinned) or, for a chat of messages, Engine.prepare_chat.
A question about the whole document is answered while it is prepared, each part on a context of
its own: its Done comes back instead of a prompt to decode.
"""

from __future__ import annotations

import threading
from collections.abc import Generator

from kvchat.engine import Engine, PreparedPrompt
from kvchat.events import Done, Event
from kvchat.llama import Sampler
from kvchat.serving.requests import ChatRequest


def prepare(
    engine: Engine, request: ChatRequest, cancel: threading.Event, sampler: Sampler
) -> Generator[Event, None, PreparedPrompt | Done]:
    """Events while reading and pruning `request`; returns its PreparedPrompt, whose first answer
    token `sampler` drew, or the Done of a question answered in parts (its Tokens among the events)."""
    if request.document is None:
        return (yield from engine.prepare_chat(request.messages, request.settings, sampler, cancel))
    conversation = engine.conversation(request.document, request.settings)
    try:
        conversation.resume(request.turns)
        return (yield from engine.prepare(conversation, request.question, request.settings, sampler, cancel))
    finally:
        conversation.close()
