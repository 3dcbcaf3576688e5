"""Uploaded documents: read with kvchat's loaders, kept in memory by id, within a memory budget.

The library holds at most `max_documents` documents and `max_bytes` of their text and page
tables together. A new upload that would not fit pushes out the documents used least recently
(uploaded, or asked about); a request naming one of those is told it was removed to make room.
A document larger than the whole budget is refused with 413.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kvchat.documents import Document, load_document
from kvchat.documents.limits import SERVER_DOCUMENTS_BYTES, size_text
from kvchat.errors import DocumentError, raise_if_cancelled
from kvchat.server.errors import ApiError

MAX_FILENAME = 255  # characters of the name shown; the file on disk has a name of its own
SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,10}")  # what the loaders look at to tell HTML from text
PAGE_BYTES = 216  # what one entry of a page table holds in memory (measured with tracemalloc)
REMEMBERED_REMOVALS = 4096  # ids of documents removed to make room that a request is told about


@dataclass(frozen=True)
class StoredDocument:
    id: str
    filename: str
    document: Document
    bytes: int
    tokens: int
    created_at: int

    @property
    def held_bytes(self) -> int:
        """Memory the document holds: its text (1, 2 or 4 bytes a character) and its page table."""
        return sys.getsizeof(self.document.text) + PAGE_BYTES * len(self.document.pages)

    def describe(self) -> dict[str, object]:
        return {
            "id": self.id, "object": "document", "filename": self.filename, "bytes": self.bytes,
            "pages": len(self.document.pages) or 1, "tokens": self.tokens, "created_at": self.created_at,
        }


class DocumentLibrary:
    """At most `max_documents` documents holding at most `max_bytes`; the least recently used go
    first when a new one would not fit."""

    def __init__(self, max_documents: int = 64, max_bytes: int = SERVER_DOCUMENTS_BYTES) -> None:
        self.max_documents = max_documents
        self.max_bytes = max_bytes
        self._documents: OrderedDict[str, StoredDocument] = OrderedDict()  # least recently used first
        self._held_bytes = 0
        self._removed: OrderedDict[str, None] = OrderedDict()  # pushed out to make room, oldest first
        self._lock = threading.Lock()

    def add(
        self, filename: str | None, data: bytes, count_tokens: Callable[[str], int], cancel: threading.Event | None = None
    ) -> StoredDocument:
        """Read an upload (raises DocumentError with a hint); `count_tokens(text)` sizes it (and
        may refuse it). Once `cancel` is set (the client left, the server stops) its OCR stops
        between pages with CancelledError, and nothing is stored. Raises ApiError 413 for a
        document larger than the library's whole budget."""
        name = upload_name(filename)
        loaded = _load(name, data, cancel)
        raise_if_cancelled(cancel)
        document = Document(path=Path(name), kind=loaded.kind, text=loaded.text, pages=loaded.pages)
        stored = StoredDocument(
            id="doc-" + hashlib.sha256(data).hexdigest()[:24], filename=name, document=document,
            bytes=len(data), tokens=count_tokens(document.text), created_at=int(time.time()),
        )
        if stored.held_bytes > self.max_bytes:
            raise ApiError(
                413, f"{name}: its text takes {size_text(stored.held_bytes)} of memory, more than this server keeps "
                f"for all documents together ({size_text(self.max_bytes)}); split it into smaller documents",
                "document_too_large", "file",
            )
        with self._lock:
            self._remove(stored.id)
            while self._documents and (len(self._documents) >= self.max_documents
                                       or self._held_bytes + stored.held_bytes > self.max_bytes):
                oldest = next(iter(self._documents))
                self._remove(oldest)
                self._removed[oldest] = None
                while len(self._removed) > REMEMBERED_REMOVALS:
                    self._removed.popitem(last=False)
            self._documents[stored.id] = stored
            self._held_bytes += stored.held_bytes
            self._removed.pop(stored.id, None)
        return stored

    def find(self, document_id: str) -> StoredDocument | None:
        """The document, now the most recently used; None if there is none of that id."""
        with self._lock:
            if (stored := self._documents.get(document_id)) is not None:
                self._documents.move_to_end(document_id)
            return stored

    def was_removed(self, document_id: str) -> bool:
        """Whether the document was pushed out to make room for newer ones (and not uploaded again)."""
        with self._lock:
            return document_id in self._removed

    def all(self) -> list[StoredDocument]:
        with self._lock:
            return list(self._documents.values())

    def delete(self, document_id: str) -> bool:
        with self._lock:
            return self._remove(document_id)

    def _remove(self, document_id: str) -> bool:
        if (stored := self._documents.pop(document_id, None)) is None:
            return False
        self._held_bytes -= stored.held_bytes
        return True


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
