"""A passage bank: the document read as its passages, each alone after the prompt's opening (the
chat template and the system prompt) and its page's mark, and each one's KV entries kept. A later
question loads the passages its words choose (passages.py), in document order, and reads only
what follows them: the first answer's reading of those passages without reading them again.

Every token of the document is read once, as in a whole reading, but no passage sees another:
the model reads 250 tokens at a time after the opening, not the 16K before them. A passage is read
right after the opening, moved (llama_memory_seq_add) so that the passage lands at its own place in
the document: the cells of any passages of one document then have distinct positions and load as
one state (llama/joined.py); once loaded they are moved to consecutive positions (llama.cpp
re-rotates K), as a fast reading reads them. A page's mark is read once, after the opening, and
each of its passages after both; a question that chooses two passages of a page loads the mark once.
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.reading.passages import Passages
from kvchat.events import Progress
from kvchat.llama import StateBytes
from kvchat.llama.joined import joined_state, state_from


@dataclass(frozen=True)
class PassageBank:
    """Each piece of a document prompt's reading as a state of its cells alone: the opening (the
    prompt's tokens before the document's text), each page's mark (keyed by its token range) and
    each passage (passages.py's order), read after the opening and its mark."""

    opening: StateBytes
    marks: dict[tuple[int, int], StateBytes]
    passages: tuple[StateBytes, ...]

    @property
    def n_bytes(self) -> int:
        return len(self.opening) + sum(map(len, self.marks.values())) + sum(map(len, self.passages))


def opening_end(passages: Passages) -> int:
    """The prompt index where the document's text (or its first page's mark) begins."""
    return int(min(passages.starts[0], passages.mark_starts[0]))


def read_bank(
    cache: KvCache, tokens: list[int], passages: Passages, cancel: threading.Event | None = None,
) -> Generator[Progress, None, PassageBank]:
    """Read the document prompt `tokens` into the empty `cache` as a bank (the module's doc), with
    progress over the prompt's tokens; the cache holds the opening after."""
    first, total = opening_end(passages), passages.n_tokens
    yield from cache.prefill(tokens[:first], 0, total, cancel)
    opening, done = cache.state(), first
    marks: dict[tuple[int, int], StateBytes] = {}
    banked: list[StateBytes] = []
    for index in range(len(passages.starts)):
        mark = (int(passages.mark_starts[index]), int(passages.mark_ends[index]))
        if mark not in marks:
            cache.drop_from(first)  # the last page's mark
            marks[mark] = yield from _read_piece(cache, tokens, mark, done, total, cancel)
            done += mark[1] - mark[0]
        after_mark = cache.cells
        span = (int(passages.starts[index]), int(passages.ends[index]))
        banked.append((yield from _read_piece(cache, tokens, span, done, total, cancel)))
        done += span[1] - span[0]
        cache.drop_from(after_mark)
    cache.drop_from(first)
    return PassageBank(opening, marks, tuple(banked))


def _read_piece(
    cache: KvCache, tokens: list[int], span: tuple[int, int], done: int, total: int, cancel: threading.Event | None,
) -> Generator[Progress, None, StateBytes]:
    """Read the prompt's tokens [start, end) at their own positions after the cells held; the state of their cells."""
    start, end = span
    held = cache.cells
    cache.skip_to(start)
    yield from cache.prefill(tokens[start:end], done, total, cancel)
    return state_from(cache.state(), held)


def load_passages_of(cache: KvCache, bank: PassageBank, passages: Passages, body: np.ndarray, tokens: list[int]) -> np.ndarray:
    """Load the opening and the passages the prompt indices `body` hold (a fast reading's choice:
    every token of each up to the question's window, which may begin inside the document's last
    passage), with their marks (load_chosen); the indices loaded."""
    chosen = np.flatnonzero(np.isin(passages.starts, body))
    upto = int(body[-1]) + 1 if len(body) else 0
    return load_chosen(cache, bank, passages, chosen, tokens, upto)


def load_chosen(
    cache: KvCache, bank: PassageBank, passages: Passages, chosen: np.ndarray, tokens: list[int], upto: int | None = None,
) -> np.ndarray:
    """Load the opening and the `chosen` passages (indices, increasing) with their pages' marks
    into `cache`, at consecutive positions, each passage's tokens before the prompt index `upto`
    only (all when None); returns the prompt indices of the tokens loaded."""
    first = opening_end(passages)
    pieces: list[StateBytes] = [bank.opening]
    origins = [np.arange(first)]
    loaded_marks: set[tuple[int, int]] = set()
    for index in chosen.tolist():
        mark = (int(passages.mark_starts[index]), int(passages.mark_ends[index]))
        if mark not in loaded_marks:
            loaded_marks.add(mark)
            pieces.append(bank.marks[mark])
            origins.append(np.arange(*mark))
        start, end = int(passages.starts[index]), int(passages.ends[index])
        kept = end - start if upto is None else min(end, upto) - start
        pieces.append(bank.passages[index] if kept == end - start else state_from(bank.passages[index], 0, kept))
        origins.append(np.arange(start, start + kept))
    held = np.concatenate(origins).astype(np.int64)
    cache.load(joined_state(pieces), held, np.asarray(tokens, dtype=np.int64)[held])
    if len(held) and held[-1] != len(held) - 1:
        cache.move_to(np.arange(len(held), dtype=np.int64))
    return held
