"""The text of a document and where each page starts in it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvchat.documents.normalize import normalize_pages

PAGE_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Page:
    """Page `number` (1-based) covers text[start:end]; in a bundle, `source` names its document
    and `kind` says what that document is (an EPUB's pages are its chapters)."""

    number: int
    start: int
    end: int
    source: str = ""
    kind: str = ""


def page_label(kind: str, first: int, last: int | None = None) -> str:
    """How kvchat names a page or pages of a document of `kind`: "p. 3", "pp. 2–3", or an EPUB's
    chapter ("ch. 3", its first where several)."""
    if kind == "epub":
        return f"ch. {first}"
    return f"p. {first}" if last is None or last == first else f"pp. {first}–{last}"


@dataclass(frozen=True)
class Document:
    path: Path
    kind: str
    text: str
    pages: list[Page] = field(default_factory=list)

    @classmethod
    def from_pages(cls, path: Path, kind: str, texts: Sequence[str], keep_indentation: bool = True) -> Document:
        """How every reader builds its Document: each page's text normalized (normalize.py), then
        laid end to end with PAGE_SEPARATOR between pages that have text. An empty page is an empty
        range where it falls, so the text neither starts nor ends with whitespace and each Page
        covers exactly its own normalized text."""
        pages: list[Page] = []
        parts: list[str] = []
        offset = 0
        for number, text in enumerate(normalize_pages(texts, keep_indentation), start=1):
            if parts and text:
                parts.append(PAGE_SEPARATOR)
                offset += len(PAGE_SEPARATOR)
            pages.append(Page(number=number, start=offset, end=offset + len(text)))
            if text:
                parts.append(text)
                offset += len(text)
        return cls(path=path, kind=kind, text="".join(parts), pages=pages)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def page_at(self, offset: int) -> int | None:
        """The page number holding character `offset`, or None for single-page text."""
        for page in self.pages:
            if page.start <= offset < page.end:
                return page.number
        return None
