"""A passage bank: the document read as its passages, each alone after the prompt's opening (the
chat template and the system prompt) and its page's mark, and each one's KV entries kept. A later
question loads the passages its words choose (text/passages.py), in document order, and reads only
what follows them: the first answer's reading of those passages without reading them again.

Every token of the document is read once, as in a whole reading, but no passage sees another:
the model reads 250 tokens at a time after the opening, not the 16K before them. A passage is read
right after the opening, moved (llama_memory_seq_add) so that the passage lands at its own place in
the document: the cells of any passages of one document then have distinct positions and load as
one state (llama/joined.py); once loaded they are moved to consecutive positions (llama.cpp
re-rotates K), as a fast reading reads them. A page's mark is read once, after the opening, and
each of its passages after both; a question that chooses two passages of a page loads the mark once.
A conversation holds and saves its bank packed (HELD_AS): its answers are the same in the process
that read it and in a later one.
"""

from __future__ import annotations

import json
import struct
import threading
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from kvchat.engine.kvcache.cache import KvCache
from kvchat.engine.kvcache.states import DocumentStates
from kvchat.engine.text.passages import PASSAGE_TOKENS, Passages
from kvchat.events import Event, Progress
from kvchat.engine.reading.sizing import round_up
from kvchat.llama import ContextSettings, LlamaContext, LlamaModel, StateBytes
from kvchat.llama.joined import joined_state, state_from
from kvchat.llama.packed import packed_state, unpacked_state


# What a bank is saved as beside the document's whole reading (states.py): its layout and the
# passages' size are part of what it holds.
BANK = f"passage-bank-1-{PASSAGE_TOKENS}"
# The block types of K and V a bank is held and saved as (llama/packed.py): 2.5 times the documents
# f16 holds in the same store, the same right answers on cuad's dev questions, and 20-30 ms to
# unpack a follow-up's passages (docs/bench.md).
HELD_AS = ("q8_0", "q4_0")
_INDEX_BYTES = struct.Struct("<I")


class DamagedBank(ValueError):
    """A saved bank's piece that does not match its checksum (a disk's error): the bank is discarded."""


@dataclass(frozen=True)
class PassageBank:
    """Each piece of a document prompt's reading as a state of its cells alone: the opening (the
    prompt's tokens before the document's text), each page's mark (keyed by its token range) and
    each passage (text/passages.py's order), read after the opening and its mark."""

    opening: StateBytes
    marks: dict[tuple[int, int], StateBytes]
    passages: tuple[StateBytes, ...]
    packed: bool = False  # the pieces' f16 layers are smaller blocks (packed_as()), unpacked as they load
    # Each piece's crc32 in to_payload()'s order (the opening, the marks, the passages), where the
    # bank was saved: a piece is checked as it loads, so that a question reads only what it loads.
    checksums: tuple[int, ...] | None = None

    @property
    def n_bytes(self) -> int:
        return len(self.opening) + sum(map(len, self.marks.values())) + sum(map(len, self.passages))

    def opening_state(self) -> StateBytes:
        return self._state(self.opening, 0)

    def mark_state(self, mark: tuple[int, int]) -> StateBytes:
        return self._state(self.marks[mark], 1 + list(self.marks).index(mark))

    def passage_state(self, index: int) -> StateBytes:
        return self._state(self.passages[index], 1 + len(self.marks) + index)

    def _state(self, piece: StateBytes, number: int) -> StateBytes:
        """The bank's `number`th piece as llama.cpp loads it (checked, unpacked); DamagedBank where
        its checksum does not match."""
        if self.checksums is not None and zlib.crc32(piece) != self.checksums[number]:
            raise DamagedBank(f"piece {number} of a passage bank does not match its checksum")
        return unpacked_state(piece) if self.packed else piece

    def packed_as(self, k_type: str, v_type: str) -> PassageBank:
        """This bank with its pieces' f16 layers as blocks of K's and V's types (llama/packed.py); itself if packed."""
        if self.packed:
            return self
        return PassageBank(packed_state(self.opening, k_type, v_type),
                           {mark: packed_state(piece, k_type, v_type) for mark, piece in self.marks.items()},
                           tuple(packed_state(piece, k_type, v_type) for piece in self.passages), packed=True)

    def to_payload(self) -> tuple[bytes, int]:
        """The bank as one saved payload: the length of a JSON index, the index (each piece's
        [offset, length] in what follows it, a mark's with its token range, whether they are
        packed, and each piece's crc32), then the pieces; and the length of what precedes the
        pieces (what the store's own checksum covers)."""
        pieces = [self.opening, *self.marks.values(), *self.passages]
        offsets = [0]
        for piece in pieces:
            offsets.append(offsets[-1] + len(piece))
        spans = [[offset, len(piece)] for offset, piece in zip(offsets, pieces)]
        index = {"opening": spans[0], "marks": [[*mark, *span] for mark, span in zip(self.marks, spans[1:])],
                 "passages": spans[1 + len(self.marks) :], "packed": self.packed, "crc32": [zlib.crc32(piece) for piece in pieces]}
        encoded = json.dumps(index).encode()
        return b"".join([_INDEX_BYTES.pack(len(encoded)), encoded, *pieces]), _INDEX_BYTES.size + len(encoded)

    @classmethod
    def from_payload(cls, payload: StateBytes) -> PassageBank:
        """The bank to_payload() saved; its pieces are views of `payload` (a mapped file is not
        read until a question loads them). ValueError where the payload is not one."""
        view = memoryview(payload)
        try:
            (length,) = _INDEX_BYTES.unpack_from(view, 0)
            index = json.loads(bytes(view[_INDEX_BYTES.size : _INDEX_BYTES.size + length]))
            base = _INDEX_BYTES.size + length

            def piece(offset: int, size: int) -> memoryview:
                if offset < 0 or size < 0 or base + offset + size > len(view):
                    raise ValueError("a piece runs past the payload")
                return view[base + offset : base + offset + size]

            bank = cls(piece(*index["opening"]), {(start, end): piece(offset, size) for start, end, offset, size in index["marks"]},
                       tuple(piece(*span) for span in index["passages"]), bool(index["packed"]), tuple(map(int, index["crc32"])))
            if len(bank.checksums or ()) != 1 + len(bank.marks) + len(bank.passages):
                raise ValueError("a checksum for each piece")
            return bank
        except (struct.error, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"not a passage bank ({error})") from None


def save_bank(states: DocumentStates | None, tokens: list[int], bank: PassageBank, document: str) -> Iterator[Event]:
    """Save the bank of the document prompt `tokens` beside its whole reading (none without a store)."""
    if states is not None:
        payload, index_bytes = bank.to_payload()
        yield from states.save(tokens, payload, f"{document} (passages)", BANK, checked_bytes=index_bytes)


def saved_bank(states: DocumentStates | None, tokens: list[int]) -> Generator[Event, None, PassageBank | None]:
    """The bank saved for the document prompt `tokens`, or None; one that is not a bank is discarded."""
    if states is None or not states.has(tokens, BANK):
        return None
    payload = yield from states.load(tokens, BANK)
    try:
        return None if payload is None else PassageBank.from_payload(payload)
    except ValueError as error:
        yield from states.discard(tokens, str(error), BANK)
        return None


def opening_end(passages: Passages) -> int:
    """The prompt index where the document's text (or its first page's mark) begins."""
    return int(min(passages.starts[0], passages.mark_starts[0]))


@dataclass
class BankPieces:
    """What a bank's reading has read so far: read_bank() goes on from here after a stop (a
    question answered meanwhile, in the chat or the server), not from the document's start."""

    opening: StateBytes | None = None
    marks: dict[tuple[int, int], StateBytes] = field(default_factory=dict)
    passages: list[StateBytes] = field(default_factory=list)

    def read_tokens(self, passages: Passages) -> int:
        """How many of the prompt's tokens these pieces read (the opening, marks and passages)."""
        if self.opening is None:
            return 0
        marks = sum(end - start for start, end in self.marks)
        return opening_end(passages) + marks + int((passages.ends - passages.starts)[: len(self.passages)].sum())


def read_bank(
    model: LlamaModel, settings: ContextSettings, tokens: list[int], passages: Passages, cancel: threading.Event | None = None,
    pieces: BankPieces | None = None,
) -> Generator[Progress, None, PassageBank]:
    """Read the document prompt `tokens` as a bank (the module's doc), f16, with progress over the
    prompt's tokens up to the document's end (a question reads the closing template), on a context of its own with `settings` but as large as the opening, a mark and
    a passage need: whatever the caller's context holds stays. `pieces`: where an earlier call
    stopped (CancelledError), filled as the reading goes on."""
    first = opening_end(passages)
    longest = int((passages.mark_ends - passages.mark_starts).max() + (passages.ends - passages.starts).max())
    with LlamaContext(model, replace(settings, n_ctx=round_up(first + longest))) as ctx:
        return (yield from _read(KvCache(ctx), tokens, passages, cancel, BankPieces() if pieces is None else pieces))


def _read(
    cache: KvCache, tokens: list[int], passages: Passages, cancel: threading.Event | None, pieces: BankPieces,
) -> Generator[Progress, None, PassageBank]:
    first, total, done = opening_end(passages), int(passages.ends[-1]), pieces.read_tokens(passages)  # the question reads the rest
    opening = cache.prefill(tokens[:first], 0, total, cancel)
    if pieces.opening is None:
        yield from opening
        pieces.opening, done = cache.state(), first
    else:  # read again after a stop (a few tokens), its progress told unchanged
        yield from (replace(event, done=done) for event in opening)
    held_mark, after_mark = None, first
    for index in range(len(pieces.passages), len(passages.starts)):
        mark = (int(passages.mark_starts[index]), int(passages.mark_ends[index]))
        if mark != held_mark:
            cache.drop_from(first)  # the last page's mark
            if mark in pieces.marks:  # a page begun before a stop: its mark read again, its progress told unchanged
                yield from (replace(event, done=done) for event in _read_piece(cache, tokens, mark, done, total, cancel))
            else:
                pieces.marks[mark] = yield from _read_piece(cache, tokens, mark, done, total, cancel)
                done += mark[1] - mark[0]
            held_mark, after_mark = mark, cache.cells
        span = (int(passages.starts[index]), int(passages.ends[index]))
        pieces.passages.append((yield from _read_piece(cache, tokens, span, done, total, cancel)))
        done += span[1] - span[0]
        cache.drop_from(after_mark)
    return PassageBank(pieces.opening, pieces.marks, tuple(pieces.passages))


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
    pieces: list[StateBytes] = [bank.opening_state()]
    origins = [np.arange(first)]
    loaded_marks: set[tuple[int, int]] = set()
    for index in chosen.tolist():
        mark = (int(passages.mark_starts[index]), int(passages.mark_ends[index]))
        if mark not in loaded_marks:
            loaded_marks.add(mark)
            pieces.append(bank.mark_state(mark))
            origins.append(np.arange(*mark))
        start, end = int(passages.starts[index]), int(passages.ends[index])
        kept = end - start if upto is None else min(end, upto) - start
        passage = bank.passage_state(index)
        pieces.append(passage if kept == end - start else state_from(passage, 0, kept))
        origins.append(np.arange(start, start + kept))
    held = np.concatenate(origins).astype(np.int64)
    cache.load(joined_state(pieces), held, np.asarray(tokens, dtype=np.int64)[held])
    if len(held) and held[-1] != len(held) - 1:
        cache.move_to(np.arange(len(held), dtype=np.int64))
    return held
