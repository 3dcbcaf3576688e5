"""Several documents asked about together, as one Document: each one's text follows a line naming
it (its file name), so the model can tell them apart, and each page keeps its document's name, so
what a selection kept can be traced to its document."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvchat.documents.model import PAGE_SEPARATOR, Document, Page

BUNDLE_KIND = "bundle"


def heading(name: str) -> str:
    """The line that introduces a document of a bundle."""
    return f"=== {name} ===\n"


def _names(documents: Sequence[Document]) -> list[str]:
    """File names; the paths as given where two documents share a file name; numbered where
    they share the path too (two uploads of the same name)."""
    names = [document.path.name for document in documents]
    names = [str(document.path) if names.count(name) > 1 else name for name, document in zip(names, documents)]
    return [f"{name} ({names[:index].count(name) + 1})" if names.count(name) > 1 else name
            for index, name in enumerate(names)]


def bundle(documents: Sequence[Document]) -> Document:
    """One Document of `documents` (one document is itself; the same file given twice counts
    once), in the order given; the texts are normalized already, and each page's range moves with
    its text."""
    documents = list({(document.path, document.sha256): document for document in documents}.values())
    if len(documents) == 1:
        return documents[0]
    names = _names(documents)
    parts: list[str] = []
    pages: list[Page] = []
    offset = 0
    for name, document in zip(names, documents):
        if parts:
            parts.append(PAGE_SEPARATOR)
            offset += len(PAGE_SEPARATOR)
        parts.append(heading(name) + document.text)
        offset += len(heading(name))
        own_pages = document.pages or [Page(number=1, start=0, end=len(document.text))]
        pages += [Page(page.number, page.start + offset, page.end + offset, name, document.kind) for page in own_pages]
        offset += len(document.text)
    return Document(path=Path(" + ".join(names)), kind=BUNDLE_KIND, text="".join(parts), pages=pages)


def _first_pages(document: Document) -> dict[str, Page]:
    first: dict[str, Page] = {}
    for page in document.pages:
        if page.source and page.source not in first:
            first[page.source] = page
    return first


def document_starts(document: Document) -> list[int]:
    """Where each document of a bundle begins in its text (at its heading); [] for one document."""
    return [page.start - len(heading(name)) for name, page in _first_pages(document).items()]


def kept_by_source(document: Document, spans: Sequence[tuple[int, int]]) -> dict[str, int]:
    """Characters of the kept `spans` of `document`'s text in each of its documents, in order;
    empty unless it is a bundle."""
    kept: dict[str, int] = {}
    for page in document.pages:
        if page.source:
            overlap = sum(max(0, min(end, page.end) - max(start, page.start)) for start, end in spans)
            kept[page.source] = kept.get(page.source, 0) + overlap
    return kept
