"""Where an answer came from: the passages of the document that its tokens attended to.

A prompt token's score is the attention the answer's tokens paid it (attention.py: read once more
after the answer, one batch, either probe, so flash attention works too). A passage is
a sentence or a line of the document's text, a long one cut at a space; its score is its share of
the attention the answer paid to the document's text, and the best ones are the sources. The
template, the question and earlier turns are not the document's text, so they are never a source.
"""

from __future__ import annotations

import re

import numpy as np
import syntok.segmenter

from kvchat.documents import Document
from kvchat.documents.bundle import BUNDLE_KIND, document_starts
from kvchat.documents.model import Page, page_label
from kvchat.events import Source

MAX_PASSAGE = 200  # characters: a source quotes one passage, cut at a space beyond this
MIN_PASSAGE = 40  # a shorter piece (a clause number, a heading) joins the one after it
SOURCES = 3
STRIP_CELLS = 100  # the stretches of the text an answer's attention is told over (Done.attention)

_LINE_BREAK = re.compile(r"[^\S\n]*\n\s*")
_BLANK_LINE = re.compile(r"[^\S\n]*\n[^\S\n]*\n\s*")
_PARAGRAPH = re.compile(r"\S(?:[^\n]|\n(?![^\S\n]*\n))*")


def _cut(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) in pieces of at most MAX_PASSAGE characters, cut at spaces where there are any."""
    pieces = []
    while end - start > MAX_PASSAGE:
        space = text.rfind(" ", start + MIN_PASSAGE, start + MAX_PASSAGE)
        stop = space if space > 0 else start + MAX_PASSAGE
        pieces.append((start, stop))
        start = stop + 1 if space > 0 else stop
    return pieces + [(start, end)]


def _over_page_breaks(text: str) -> str:
    """`text` with each blank line that a sentence goes on over (a page break: no sentence end
    before it, a lower-case word after it) made spaces, so that its paragraphs hold whole sentences."""
    def joined(match: re.Match[str]) -> str:
        before, after = match.start(), match.end()
        goes_on = before > 0 and after < len(text) and text[before - 1] not in ".!?:;" and text[after].islower()
        return " " * (after - before) if goes_on else match.group()

    return _BLANK_LINE.sub(joined, text)


def _end_before(text: str, offset: int) -> int:
    """Where the text before `offset` ends, the spaces just before it left out."""
    while offset > 0 and text[offset - 1].isspace():
        offset -= 1
    return offset


def _sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The [start, end) ranges of the sentences of the paragraph text[start:end], as syntok finds
    them. Chosen by measurement over pysbd and blingfire: it keeps "Care G. B. Plus Ltd.", "U.S."
    and "e.g." whole and made no false break among the 2,769 of the CUAD contracts, where pysbd
    broke "Corp." and lists (docs/bench/design-history.md, "Sources cut by syntok's sentences"); blingfire ships x86-64 builds only.
    A paragraph at a time: syntok's time grows faster than the text it is given."""
    paragraph = text[start:end]
    starts = [sentence[0].offset for found in syntok.segmenter.analyze(paragraph) for sentence in found][1:]
    starts = [start + offset for offset in starts]
    return list(zip([start, *starts], [*(_end_before(text, offset) for offset in starts), end]))


def _ends_piece(text: str, before: int, after: int) -> bool:
    """Whether the line break text[before:after] inside a sentence ends a piece of it: after a
    colon or semicolon (a list's items), or after no sentence end with no lower-case word next (a
    heading, a clause number, a footer). After a full stop the sentence goes on, as syntok found
    ("Care G. B.\nPlus Ltd."), and so it does over a line wrapped before a lower-case word."""
    end = text[before - 1]
    return end in ":;" or (end not in ".!?" and not text[after].islower())


def _pieces(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The sentence text[start:end] in the pieces its line breaks end (_ends_piece)."""
    pieces = []
    for match in _LINE_BREAK.finditer(text, start, end):
        if _ends_piece(text, match.start(), match.end()):
            pieces.append((start, match.start()))
            start = match.end()
    return [*pieces, (start, end)]


def passages(text: str) -> list[tuple[int, int]]:
    """The [start, end) ranges of `text`'s sentences and lines, in order (a sentence that goes
    on over a line or page break is one): a long one cut into pieces of at most MAX_PASSAGE
    characters; one shorter than MIN_PASSAGE joins the sentence before it on its line, and a
    short line (a heading, a clause number) the line after it."""
    flat = _over_page_breaks(text)
    paragraphs = [(match.start(), _end_before(flat, match.end())) for match in _PARAGRAPH.finditer(flat)]
    bounds = [piece for paragraph in paragraphs for sentence in _sentences(flat, *paragraph)
              for piece in _pieces(text, *sentence)]
    joined: list[tuple[int, int]] = []
    for start, end in (piece for bound in bounds if bound[1] > bound[0] for piece in _cut(text, *bound)):
        if joined and end - joined[-1][0] <= MAX_PASSAGE:
            before_start, before_end = joined[-1]
            short_before = before_end - before_start < MIN_PASSAGE
            same_line = "\n" not in text[before_end:start]
            if short_before or (end - start < MIN_PASSAGE and same_line):
                joined[-1] = (before_start, end)
                continue
        joined.append((start, end))
    return joined


class SourceFinder:
    """The sources of answers about one document: built once (it splits the text into passages)."""

    def __init__(self, document: Document, token_ranges: tuple[np.ndarray, np.ndarray] | None) -> None:
        """`token_ranges`: (starts, ends), the characters of the text each prompt token at that
        position covers (kept.token_char_ranges); None when they cannot be known, and then an
        answer has no sources."""
        self.document = document
        self._token_ranges = token_ranges
        text, cuts = document.text, [0, *document_starts(document)[1:], len(document.text)]  # several: each its own
        found = [(start + a, start + b) for start, end in zip(cuts, cuts[1:]) for a, b in passages(text[start:end])]
        self._passages = np.asarray(found or [(0, 0)], dtype=np.int64)

    def sources(self, positions: np.ndarray, scores: np.ndarray, limit: int = SOURCES) -> tuple[Source, ...]:
        """The `limit` passages whose tokens drew the most of `scores` (one per prompt cell, which
        holds `positions`), most first; a passage that drew nothing is not a source."""
        if (found := self._in_text(positions, scores)) is None:
            return ()
        positions, shares = found
        # a token belongs where its last character is (" Israel" starts on the space before)
        passage = np.searchsorted(self._passages[:, 0], self._token_ranges[1][positions] - 1, side="right") - 1
        drawn = np.bincount(np.maximum(passage, 0), weights=shares, minlength=len(self._passages))
        ranked = [int(i) for i in np.argsort(-drawn, kind="stable")[:limit] if drawn[i] > 0]
        return tuple(self._source(*self._passages[i], float(drawn[i])) for i in ranked)

    def strip(self, positions: np.ndarray, scores: np.ndarray, cells: int = STRIP_CELLS) -> tuple[float, ...]:
        """The share of `scores` (as in sources()) that the tokens in each of `cells` equal
        stretches of the document's text drew, start to end; () when it cannot be told."""
        if (found := self._in_text(positions, scores)) is None:
            return ()
        positions, shares = found
        cell = np.minimum(self._token_ranges[0][positions] * cells // len(self.document.text), cells - 1)
        return tuple(round(float(share), 5) for share in np.bincount(cell, weights=shares, minlength=cells))

    def _in_text(self, positions: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The positions of the document's text among `positions` that drew some of `scores`, and
        each one's share of what they drew together; None when nothing there drew any."""
        if self._token_ranges is None:
            return None
        starts, ends = self._token_ranges
        inside = (positions < len(starts)) & (scores > 0)
        positions, scores = positions[inside], scores[inside]
        in_text = ends[positions] > starts[positions]
        positions, scores = positions[in_text], scores[in_text].astype(np.float64)
        total = float(scores.sum())
        return (positions, scores / total) if total > 0 else None

    def where(self, start: int, end: int) -> str:
        """How a source says where text[start:end] is ("pp. 3–5", "line 12")."""
        return self._where(start, end)[0]

    def source_at(self, start: int, end: int, score: float) -> Source:
        """The passage text[start:end] as a source (an answer about a part of the document found it)."""
        return self._source(start, end, score)

    def _source(self, start: int, end: int, score: float) -> Source:
        start, end = int(start), int(end)
        quote = " ".join(self.document.text[start:end].split())
        where, page, name = self._where(start, end)
        return Source(start=start, end=end, text=quote, score=round(score, 4), where=where, page=page, document=name)

    def _where(self, start: int, end: int) -> tuple[str, int | None, str]:
        """(how to say where text[start:end] is, its first page or chapter, its document's name)."""
        document = self.document
        pages = [page for page in document.pages if page.start < max(end, start + 1) and start < page.end]
        if not pages:
            return f"line {self._line(start, 0)}", None, ""
        first = pages[0]
        if document.kind == BUNDLE_KIND:
            own = [page for page in document.pages if page.source == first.source]
            pages = [page for page in pages if page.source == first.source]
            where = self._pages(pages, first.kind) if len(own) > 1 else f"line {self._line(start, own[0].start)}"
            return f"{first.source}, {where}", first.number if len(own) > 1 else None, first.source
        if document.kind in ("pdf", "epub"):
            return self._pages(pages, document.kind), first.number, ""
        return f"line {self._line(start, 0)}", None, ""

    @staticmethod
    def _pages(pages: list[Page], kind: str) -> str:
        """Where `pages` are: an EPUB's first chapter ("ch. 3"), a PDF's page or pages ("pp. 2–3")."""
        return page_label(kind, pages[0].number, pages[-1].number)

    def _line(self, offset: int, base: int) -> int:
        return self.document.text.count("\n", base, offset) + 1
