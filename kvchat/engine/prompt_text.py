"""A document's text as its prompt holds it: a PDF's or an EPUB's every page after a line that names
it ("[p. 3]", "[ch. 2]"), so that passages read apart from the rest (a reading the question
chooses) still say where they stand, as a retrieval tool's chunks carry their page, and an answer
can name it. Other documents are held as they are; so is a bundle of several, whose headings name
each of them.

A mark holds none of the document's characters: `to_document` maps the prompt's text back to the
document's, and a token that reads only a mark covers an empty range of it (document_text.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvchat.documents import Document
from kvchat.documents.model import page_label

MARKED_KINDS = ("pdf", "epub")


def page_mark(kind: str, number: int) -> str:
    """The line before a page's text in the prompt."""
    return f"[{page_label(kind, number)}]\n"


@dataclass(frozen=True)
class PromptText:
    """`text`, and for each of its characters and one past its end the document's character it
    is (a mark's: the page's first), or None where it is the document's text itself; `in_mark`:
    which of its characters belong to a page's mark (None: none)."""

    text: str
    to_document: np.ndarray | None = None
    in_mark: np.ndarray | None = None

    def document_ranges(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[starts, ends) ranges of `text` as ranges of the document's text (a mark's: empty)."""
        if self.to_document is None:
            return starts, ends
        return self.to_document[starts], self.to_document[ends]

    def touches_mark(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Which [starts, ends) ranges of `text` hold a character of a page's mark."""
        if self.in_mark is None:
            return np.zeros(len(starts), dtype=bool)
        marked = np.concatenate([[0], np.cumsum(self.in_mark, dtype=np.int64)])
        return marked[ends] > marked[starts]


def prompt_text(document: Document) -> PromptText:
    """`document`'s text with its pages' marks, where its kind has pages (MARKED_KINDS)."""
    if document.kind not in MARKED_KINDS or not document.pages:
        return PromptText(document.text)
    pieces: list[str] = []
    to_document: list[np.ndarray] = []
    at = 0
    for page in document.pages:
        if page.end <= page.start:  # an empty page has no text to name
            continue
        mark = page_mark(document.kind, page.number)
        pieces += [document.text[at : page.start], mark]
        to_document += [np.arange(at, page.start), np.full(len(mark), page.start)]
        at = page.start
    pieces.append(document.text[at:])
    to_document.append(np.arange(at, len(document.text) + 1))
    mapping = np.concatenate(to_document).astype(np.int64)
    in_mark = np.concatenate([np.zeros(len(piece), dtype=bool) if index % 2 == 0 else np.ones(len(piece), dtype=bool)
                              for index, piece in enumerate(pieces)])
    return PromptText("".join(pieces), mapping, in_mark)
