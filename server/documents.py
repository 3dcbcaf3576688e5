"""Uploaded documents: read with kvchat's loaders, kept in memory by id."""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kvchat.documents import Document, load_document


@dataclass(frozen=True)
class StoredDocument:
    id: str
    filename: str
    document: Document
    bytes: int
    tokens: int
    created_at: int

    def describe(self) -> dict[str, object]:
        return {
            "id": self.id, "object": "document", "filename": self.filename, "bytes": self.bytes,
            "pages": len(self.document.pages) or 1, "tokens": self.tokens, "created_at": self.created_at,
        }


class DocumentLibrary:
    """At most `max_documents` documents; the oldest goes first when a new one would not fit."""

    def __init__(self, max_documents: int = 64) -> None:
        self.max_documents = max_documents
        self._documents: dict[str, StoredDocument] = {}
        self._lock = threading.Lock()

    def add(self, filename: str, data: bytes, count_tokens) -> StoredDocument:
        """Read an upload (raises DocumentError with a hint); `count_tokens(text)` sizes it."""
        name = Path(filename or "document").name or "document"
        with tempfile.TemporaryDirectory(prefix="kvchat-upload-") as folder:
            path = Path(folder) / name
            path.write_bytes(data)
            loaded = load_document(path)
        document = Document(path=Path(name), kind=loaded.kind, text=loaded.text, pages=loaded.pages)
        stored = StoredDocument(
            id="doc-" + hashlib.sha256(data).hexdigest()[:24], filename=name, document=document,
            bytes=len(data), tokens=count_tokens(document.text), created_at=int(time.time()),
        )
        with self._lock:
            self._documents.pop(stored.id, None)
            while len(self._documents) >= self.max_documents:
                self._documents.pop(next(iter(self._documents)))
            self._documents[stored.id] = stored
        return stored

    def find(self, document_id: str) -> StoredDocument | None:
        with self._lock:
            return self._documents.get(document_id)

    def all(self) -> list[StoredDocument]:
        with self._lock:
            return list(self._documents.values())

    def delete(self, document_id: str) -> bool:
        with self._lock:
            return self._documents.pop(document_id, None) is not None
