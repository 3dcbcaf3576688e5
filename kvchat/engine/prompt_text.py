"""A document's text as its prompt holds it: a PDF's or an EPUB's every page after a line that names
it ("[p. 3]", "[ch. 2]"), so that passages read apart from the rest (a reading the question
chooses) still say where they stand, as a retrieval tool's chunks carry their page and file, and
an answer can name it. In a bundle of several documents every page's line names its document too
("[a.pdf, p. 3]"; "[notes.txt]" for a document without pages), as sources do. Other documents are
held as they are.

A mark holds none of the document's characters: `to_document` maps the prompt's text back to the
document's, and a token that reads only a mark covers an empty range of it (text/document_text.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvchat.documents import Document
from kvchat.documents.bundle import BUNDLE_KIND, document_starts
from kvchat.documents.model import Page, page_label
from kvchat.engine.prompt import PromptPart, document_part
from kvchat.llama import LlamaModel

MARKED_KINDS = ("pdf", "epub")


def page_mark(document: Document, page: Page) -> str | None:
    """The line before `page`'s text in `document`'s prompt; None where its kind has no pages
    and it is not in a bundle."""
    if document.kind == BUNDLE_KIND:
        names = [page.source, page_label(page.kind, page.number)] if page.kind in MARKED_KINDS else [page.source]
    elif document.kind in MARKED_KINDS:
        names = [page_label(document.kind, page.number)]
    else:
        return None
    return f"[{', '.join(names)}]\n"


@dataclass(frozen=True)
class PromptText:
    """`text`, and for each of its characters and one past its end the document's character it
    is (a mark's: the page's first), or None where it is the document's text itself; `in_mark`:
    which of its characters belong to a page's mark (None: none)."""

    text: str
    to_document: np.ndarray | None = None
    in_mark: np.ndarray | None = None

    def offset_of(self, document_offset: int) -> int:
        """Where the document's character at `document_offset` stands in `text`."""
        if self.to_document is None:
            return document_offset
        # to_document never decreases, and a mark maps to its page's first character and comes
        # before it: of the places that map to an offset, the document's own character is the last
        return int(np.searchsorted(self.to_document, document_offset, side="right")) - 1

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
    """`document`'s text with its pages' marks (page_mark), where it has any."""
    marked = [(page, mark) for page in document.pages
              if page.end > page.start and (mark := page_mark(document, page)) is not None]  # an empty page has no text to name
    if not marked:
        return PromptText(document.text)
    pieces: list[str] = []
    to_document: list[np.ndarray] = []
    at = 0
    for page, mark in marked:
        pieces += [document.text[at : page.start], mark]
        to_document += [np.arange(at, page.start), np.full(len(mark), page.start)]
        at = page.start
    pieces.append(document.text[at:])
    to_document.append(np.arange(at, len(document.text) + 1))
    mapping = np.concatenate(to_document).astype(np.int64)
    in_mark = np.concatenate([np.zeros(len(piece), dtype=bool) if index % 2 == 0 else np.ones(len(piece), dtype=bool)
                              for index, piece in enumerate(pieces)])
    return PromptText("".join(pieces), mapping, in_mark)


def document_prompt(model: LlamaModel, document: Document, held: PromptText, system: str | None) -> tuple[PromptPart, list[int]]:
    """The prompt's document part (`held`: the document's text with its pages' marks, after the
    system prompt) and its tokens: what a conversation reads, and what the way it is read is
    decided by (registry.reading_of), for a question, `kvchat inspect` and an upload alike."""
    part = document_part(model, held.text, system)
    runs = document_runs(model, document, held, part)
    return part, [token for run in runs for token in run] if runs else part.tokens(model)


def document_runs(model: LlamaModel, document: Document, held: PromptText, part: PromptPart) -> list[list[int]] | None:
    """Several documents (`held`: their text with its pages' marks, in the prompt's document
    `part`): that part's tokens as [prefix, one run per document, suffix], each tokenized on its
    own; None for one document. A document's run is its heading and text between the line breaks
    around them (the prompt's own before the first and after the last, the separator's between
    two), so it is the same tokens wherever the document stands among the others."""
    starts = document_starts(document)
    if not starts:
        return None
    at = part.text.find(held.text)
    cuts = [at + held.offset_of(start) - 1 for start in starts] + [at + len(held.text) + 1]
    if any(part.text[cut - 1] != "\n" for cut in cuts[1:]) or part.text[cuts[0]] != "\n":
        raise ValueError("several documents need a line break around each")
    return part.token_runs(model, cuts)
