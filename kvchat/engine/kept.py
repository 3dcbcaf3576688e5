"""Which parts of the document text the last selection kept, as character ranges.

The prompt's document part is tokenized as one string, so the tokens' bytes, laid end to end,
are that string's UTF-8 bytes: a kept token's byte range maps back to the document's text.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kvchat.llama import LlamaModel


def _char_index_of_bytes(text: str) -> np.ndarray:
    """For each UTF-8 byte of `text` (and one past the end): the index of its character."""
    widths = np.fromiter((len(ch.encode("utf-8")) for ch in text), dtype=np.int64, count=len(text))
    return np.append(np.repeat(np.arange(len(text), dtype=np.int64), widths), len(text))


def kept_text_spans(
    model: LlamaModel,
    document_part: str,
    document_text: str,
    document_tokens: list[int],
    kept_positions: Iterable[int],
) -> list[tuple[int, int]]:
    """Merged [start, end) character ranges of `document_text` (which occurs in `document_part`,
    the rendered prompt prefix that `document_tokens` encode) covered by kept token positions.
    Empty if the tokens do not spell the rendered text byte for byte."""
    lengths = model.piece_lengths(document_tokens)
    ends = np.cumsum(lengths)
    text_at = document_part.find(document_text)
    if text_at < 0 or not len(ends) or ends[-1] != len(document_part.encode("utf-8")):
        return []
    text_start = len(document_part[:text_at].encode("utf-8"))
    text_bytes = len(document_text.encode("utf-8"))
    positions = np.sort(np.fromiter((p for p in kept_positions if 0 <= p < len(document_tokens)), dtype=np.int64))
    starts = np.clip(ends[positions] - lengths[positions] - text_start, 0, text_bytes)
    stops = np.clip(ends[positions] - text_start, 0, text_bytes)
    char_of = _char_index_of_bytes(document_text)
    spans: list[tuple[int, int]] = []
    for start, stop in zip(starts.tolist(), stops.tolist()):
        if stop <= start:
            continue
        first, last = int(char_of[start]), int(char_of[stop - 1]) + 1
        if spans and first <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], last))
        else:
            spans.append((first, last))
    return spans
