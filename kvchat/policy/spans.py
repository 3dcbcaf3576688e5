"""Spans of tokens that only make sense together: the pieces of a number or a word, a sentence, or
a chunk of the text.

Qwen and Llama tokenizers split numbers into single digits, so a value like 7007071 is seven
tokens; keeping only the ones that won the vote truncates the answer ("700."). Span-aware
selection keeps a span whole once one of its tokens is chosen. `words` spans hold a number or a
word; `sentences` spans hold a sentence or clause (up to MAX_SENTENCE_TOKENS), so that a chosen
word keeps the words around it ("one (1) year from delivery", not "year delivery"). `chunks` are
runs of CHUNK_TOKENS tokens, whatever they hold: Speculative Prefill's (Liu et al. 2025) chunk
selection, for choosing passages to read again rather than entries to keep.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

SpanMode = Literal["none", "words", "sentences", "chunks"]
SPAN_MODES: tuple[SpanMode, ...] = get_args(SpanMode)
MAX_WORD_TOKENS = 16
MAX_SENTENCE_TOKENS = 48
SENTENCE_ENDS = ".;!?"
CHUNK_TOKENS = 32  # Speculative Prefill's chunk size


def _continues_word(previous: str, piece: str) -> bool:
    if not piece or not previous or piece[0].isspace():
        return False
    if piece[0].isdigit():
        return previous[-1].isdigit() or previous[-1] in ".,-:/"
    if piece[0] in ".,-:/":
        return previous[-1].isdigit() and len(piece) == 1
    return piece[0].isalpha() and previous[-1].isalnum()


def _continues_sentence(previous: str, piece: str) -> bool:
    if "\n" in previous or piece.startswith("\n"):
        return False
    stripped = previous.rstrip()
    ends = bool(stripped) and stripped[-1] in SENTENCE_ENDS and (stripped != previous or piece[:1].isspace())
    return not ends


def spans_from_pieces(pieces: list[str], mode: SpanMode = "words") -> np.ndarray:
    """Span id per token (non-decreasing), from each token's decoded text."""
    if mode == "none":
        return np.arange(len(pieces), dtype=np.int64)
    if mode == "chunks":
        return np.arange(len(pieces), dtype=np.int64) // CHUNK_TOKENS
    continues, max_span = (_continues_sentence, MAX_SENTENCE_TOKENS) if mode == "sentences" else (_continues_word, MAX_WORD_TOKENS)
    span_ids = np.zeros(len(pieces), dtype=np.int64)
    current, length = 0, 0
    for index, piece in enumerate(pieces):
        if index > 0 and not (continues(pieces[index - 1], piece) and length < max_span):
            current += 1
            length = 0
        span_ids[index] = current
        length += 1
    return span_ids
