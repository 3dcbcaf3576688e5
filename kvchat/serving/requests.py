"""A chat request: a question about a document, or a chat of messages (prepared.py prepares it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvchat.documents import Document
from kvchat.engine import AskSettings, Turn


@dataclass(frozen=True)
class ChatRequest:
    """What to answer: about `document` (its saved reading is reused; earlier `turns` are pinned
    and the question observes), or a plain chat of `messages` in the model's own template."""

    settings: AskSettings
    document: Document | None = None
    turns: tuple[Turn, ...] = ()
    question: str = ""
    messages: tuple[dict[str, str], ...] = field(default=())

