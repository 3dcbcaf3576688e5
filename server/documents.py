"""Uploaded documents: read with kvchat's loaders, kept in memory by id."""

from __future__ import annotations

import hashlib
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kvchat.documents import Document, load_document
from kvchat.errors import DocumentError, raise_if_cancelled

MAX_FILENAME = 255  # characters of the name shown; the file on disk has a name of its own
SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")  # what the loaders look at to tell HTML from text


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

    def add(
        self, filename: str | None, data: bytes, count_tokens: Callable[[str], int], cancel: threading.Event | None = None
    ) -> StoredDocument:
        """Read an upload (raises DocumentError with a hint); `count_tokens(text)` sizes it (and
        may refuse it). Once `cancel` is set (the client left, the server stops) its OCR stops
        between pages with CancelledError, and nothing is stored."""
        name = upload_name(filename)
        loaded = _load(name, data, cancel)
        raise_if_cancelled(cancel)
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


def upload_name(filename: str | None) -> str:
    """The client's file name without folders or control characters, at most MAX_FILENAME
    characters ('', '.' and '..' become 'document')."""
    name = PurePosixPath((filename or "").replace("\\", "/")).name
    name = "".join(char if char.isprintable() else "?" for char in name)[:MAX_FILENAME]
    return "document" if name in ("", ".", "..") else name


def _load(name: str, data: bytes, cancel: threading.Event | None = None) -> Document:
    """Read the upload from a temporary file of a safe name (a client's name may be '..' or too
    long for the file system), in a folder removed on every way out; errors name the client's
    file, not the server's temporary path."""
    suffix = PurePosixPath(name).suffix
    with tempfile.TemporaryDirectory(prefix="kvchat-upload-") as folder:
        path = Path(folder) / ("upload" + (suffix if SUFFIX.fullmatch(suffix) else ""))
        path.write_bytes(data)
        try:
            return load_document(path, cancel=cancel)
        except DocumentError as error:
            raise DocumentError(error.message.replace(str(path), name), error.hint.replace(str(path), name)) from None
