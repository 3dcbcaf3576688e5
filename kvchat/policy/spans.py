"""Spans of tokens that only make sense together: the digits of a number, the pieces of a word.

Qwen and Llama tokenizers split numbers into single digits, so a value like 7007071 is seven
tokens; keeping only the ones that won the vote truncates the answer ("700."). Span-aware
selection keeps a span whole once one of its tokens is chosen.
"""

from __future__ import annotations

import numpy as np

MAX_SPAN_TOKENS = 16


def _continues(previous: str, piece: str) -> bool:
    if not piece or not previous or piece[0].isspace():
        return False
    if piece[0].isdigit():
        return previous[-1].isdigit() or previous[-1] in ".,-:/"
    if piece[0] in ".,-:/":
        return previous[-1].isdigit() and len(piece) == 1
    return piece[0].isalpha() and previous[-1].isalnum()


def spans_from_pieces(pieces: list[str], max_span: int = MAX_SPAN_TOKENS) -> np.ndarray:
    """Span id per token (non-decreasing), from each token's decoded text."""
    span_ids = np.zeros(len(pieces), dtype=np.int64)
    current, length = 0, 0
    for index, piece in enumerate(pieces):
        if index > 0 and not (_continues(pieces[index - 1], piece) and length < max_span):
            current += 1
            length = 0
        span_ids[index] = current
        length += 1
    return span_ids
