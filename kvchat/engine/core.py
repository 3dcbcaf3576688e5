"""The Engine: one loaded model shared by every ask of a front end."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from kvchat.documents import Document
from kvchat.engine.ask import ask_tokens
from kvchat.engine.prompt import document_messages
from kvchat.engine.settings import AskSettings
from kvchat.events import Event
from kvchat.llama import LlamaModel
from kvchat.models import resolve_model


class Engine:
    """Load a model once (by registry name or GGUF path); ask questions about documents."""

    def __init__(self, model: str = "default", gpu_layers: int = 0) -> None:
        self.model_name = model
        self.model_path: Path = resolve_model(model)
        self.model = LlamaModel(self.model_path, gpu_layers=gpu_layers)

    def prompt_tokens(self, document: Document, question: str) -> list[int]:
        return self.prompt_tokens_for_text(document.text, question)

    def prompt_tokens_for_text(self, document_text: str, question: str) -> list[int]:
        prompt = self.model.apply_chat_template(document_messages(document_text, question))
        return self.model.tokenize(prompt)

    def ask(
        self,
        document: Document,
        question: str,
        settings: AskSettings | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Stream events for one question: Progress…, Pruned?, Token…, Done."""
        tokens = self.prompt_tokens(document, question)
        return ask_tokens(self.model, tokens, settings or AskSettings(), self.model_name, cancel)

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
