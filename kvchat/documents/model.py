"""The text of a document and where each page starts in it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Page:
    """Page `number` (1-based) covers text[start:end]."""

    number: int
    start: int
    end: int


@dataclass(frozen=True)
class Document:
    path: Path
    kind: str
    text: str
    pages: list[Page] = field(default_factory=list)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def page_at(self, offset: int) -> int | None:
        """The page number holding character `offset`, or None for single-page text."""
        for page in self.pages:
            if page.start <= offset < page.end:
                return page.number
        return None
