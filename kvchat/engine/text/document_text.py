"""Where the prompt's tokens sit in the document's text, as character ranges: what a selection
kept (the kept view), and which passages an answer drew on (sources.py).

The prompt's document part is tokenized as one string, so the tokens' bytes, laid end to end,
are that string's UTF-8 bytes: a token's byte range maps back to the document's text.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Generator, Iterable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from kvchat.documents import Document
from kvchat.documents.bundle import BUNDLE_KIND, kept_by_source
from kvchat.engine.text.sources import SourceFinder
from kvchat.engine.prompt_text import PromptText, document_prompt, prompt_text
from kvchat.engine.text.passages import Passages
from kvchat.events import Event, Pruned
from kvchat.llama import LlamaModel


def _char_index_of_bytes(text: str) -> np.ndarray:
    """For each UTF-8 byte of `text` (and one past the end): the index of its character."""
    widths = np.fromiter((len(ch.encode("utf-8")) for ch in text), dtype=np.int64, count=len(text))
    return np.append(np.repeat(np.arange(len(text), dtype=np.int64), widths), len(text))


def token_char_ranges(
    model: LlamaModel, document_part: str, document_text: str, document_tokens: list[int]
) -> tuple[np.ndarray, np.ndarray] | None:
    """(starts, ends): for each token of `document_tokens` (which encode `document_part`, the
    rendered prompt prefix holding `document_text`), the [start, end) characters of
    `document_text` it covers; start == end for a token outside the text (the template).
    None if the tokens do not spell the rendered text byte for byte."""
    lengths = model.piece_lengths(document_tokens)
    ends = np.cumsum(lengths)
    text_at = document_part.find(document_text)
    if text_at < 0 or not len(ends) or ends[-1] != len(document_part.encode("utf-8")):
        return None
    text_start = len(document_part[:text_at].encode("utf-8"))
    text_bytes = len(document_text.encode("utf-8"))
    byte_starts = np.clip(ends - lengths - text_start, 0, text_bytes)
    byte_stops = np.clip(ends - text_start, 0, text_bytes)
    char_of = _char_index_of_bytes(document_text)
    starts = char_of[byte_starts]
    stops = np.where(byte_stops > byte_starts, char_of[np.maximum(byte_stops - 1, 0)] + 1, starts)
    return starts, stops


def kept_text_spans(
    model: LlamaModel,
    document_part: str,
    document_text: str,
    document_tokens: list[int],
    kept_positions: Iterable[int],
) -> list[tuple[int, int]]:
    """Merged [start, end) character ranges of `document_text` covered by kept token positions.
    Empty if the tokens do not spell the rendered text byte for byte."""
    return spans_of(token_char_ranges(model, document_part, document_text, document_tokens), kept_positions)


def spans_of(ranges: tuple[np.ndarray, np.ndarray] | None, kept_positions: Iterable[int]) -> list[tuple[int, int]]:
    """kept_text_spans from the document's token_char_ranges, already found (None: none known)."""
    if ranges is None:
        return []
    starts, stops = ranges
    positions = np.sort(np.fromiter((p for p in kept_positions if 0 <= p < len(starts)), dtype=np.int64))
    spans: list[tuple[int, int]] = []
    for first, last in zip(starts[positions].tolist(), stops[positions].tolist()):
        if last <= first:
            continue
        if spans and first <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], last))
        else:
            spans.append((first, last))
    return spans


class DocumentText:
    """A conversation's document as its prompt holds it: which of its text the kept cells hold
    (the kept view, Pruned's spans) and what names an answer's sources. The tokens' character
    ranges are found once, at the first answer that needs them."""

    def __init__(self, model: LlamaModel, document: Document, text: PromptText, document_part: str,
                 document_tokens: list[int]) -> None:
        self.model = model
        self.document = document
        self.text = text  # the document's text as the prompt holds it, with its pages' marks
        self.document_part = document_part  # the rendered prompt prefix holding that text
        self.document_tokens = document_tokens

    @cached_property
    def _prompt_ranges(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each token's [start, end) characters of the prompt's text (marks and all)."""
        return token_char_ranges(self.model, self.document_part, self.text.text.strip(), self.document_tokens)

    @cached_property
    def token_ranges(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each token's [start, end) characters of the document's text: empty outside it (the
        template, a page's mark)."""
        ranges = self._prompt_ranges
        return None if ranges is None else self.text.document_ranges(*ranges)

    @cached_property
    def passages(self) -> Passages:
        """The document's passages, for a reading the question's words choose (passages.py), each
        read after its page's mark."""
        n_tokens = len(self.document_tokens)
        ranges, prompt_ranges = self.token_ranges, self._prompt_ranges
        in_text = ranges[1] > ranges[0] if ranges is not None else np.ones(n_tokens, dtype=bool)
        marks = self.text.touches_mark(*prompt_ranges) if prompt_ranges is not None else np.zeros(n_tokens, dtype=bool)
        return Passages.cut(self.model.pieces_text(self.document_tokens), in_text & ~marks, marks)

    @cached_property
    def source_finder(self) -> SourceFinder:
        """What turns the attention of the document's prompt cells into sources."""
        return SourceFinder(self.document, self.token_ranges)

    def kept_spans(self, kept_positions: Iterable[int]) -> list[tuple[int, int]]:
        """Character ranges of the document's text (stripped, as the model saw it) that the
        cells at `kept_positions` hold: what a selection kept, for showing to the user."""
        return spans_of(self.token_ranges, kept_positions)

    def with_kept_text(self, selection: Generator[Event, None, object]) -> Generator[Event, None, object]:
        """`selection`'s events, its Pruned saying which of the document's text it kept (and how
        much of each, about several documents); returns what it returns."""
        while True:
            try:
                event = next(selection)
            except StopIteration as finished:
                return finished.value
            if isinstance(event, Pruned):
                spans = self.kept_spans(event.kept_positions)
                kept = kept_by_source(self.document, spans) if self.document.kind == BUNDLE_KIND else {}
                event = replace(event, kept_spans=tuple(spans), kept_by_document=tuple(kept.items()))
            yield event


@dataclass(frozen=True)
class PreparedDocument:
    """What every conversation about one document with one system prompt starts from: its text
    with its pages' marks (`held`), its prompt's document part's tokens, and their DocumentText,
    whose passages and token ranges are found once for all of them."""

    held: PromptText
    tokens: list[int]
    text: DocumentText


def prepare(model: LlamaModel, document: Document, system: str | None) -> PreparedDocument:
    held = prompt_text(document)
    part, tokens = document_prompt(model, document, held, system)
    return PreparedDocument(held, tokens, DocumentText(model, document, held, part.text, tokens))


class PreparedDocuments:
    """The last `most` documents prepared (prepare()), for the conversations about them after: a
    kept model (cli/resident.py) and the server answer one document again and again, and its
    tokens, passages and token ranges take a quarter of a second at 16K tokens."""

    def __init__(self, model: LlamaModel, most: int = 4) -> None:
        self.model, self.most = model, most
        self._prepared: OrderedDict[tuple, PreparedDocument] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, document: Document, system: str | None) -> PreparedDocument:
        key = (document.path, document.kind, document.text, tuple(document.pages), system)
        with self._lock:
            prepared = self._prepared.pop(key, None)
        prepared = prepared or prepare(self.model, document, system)
        with self._lock:
            self._prepared[key] = prepared
            while len(self._prepared) > self.most:
                self._prepared.popitem(last=False)
        return prepared
