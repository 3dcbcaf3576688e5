"""The one event stream the engine emits and every front end renders."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from kvchat.errors import printable

_Made = TypeVar("_Made")


@dataclass(frozen=True)
class Progress:
    """Prompt reading: `done` of `total` tokens, the tokens after `read_from` read in `elapsed_s`
    seconds (those before it were read earlier, or loaded from a saved reading; a pause is not
    reading time: timed())."""

    done: int
    total: int
    elapsed_s: float
    read_from: int = 0

    @property
    def tokens_per_s(self) -> float:
        return (self.done - self.read_from) / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class Pruned:
    """The prompt's cache was reduced from `prompt_tokens` to `kept_tokens` entries;
    `kept_positions`: the prompt tokens kept (by any head); `kept_heads`: kept per head, how many
    of the model's (layer, KV head) pairs kept each of them, of `head_count` (none: all kept all);
    `kept_by_document`: characters of each document's text kept, when several are asked about."""

    prompt_tokens: int
    kept_tokens: int
    kept_positions: tuple[int, ...] = field(repr=False)
    observe_s: float = 0.0
    compact_s: float = 0.0
    kept_by_document: tuple[tuple[str, int], ...] = ()
    kept_heads: tuple[int, ...] = field(default=(), repr=False)
    kept_spans: tuple[tuple[int, int], ...] = field(default=(), repr=False)  # the document's text kept: [start, end) characters
    head_count: int = 0


@dataclass(frozen=True)
class Evicted:
    """Entries removed while reading or generating (the sink + recent ring)."""

    count: int
    positions: tuple[int, ...] = field(repr=False)


@dataclass(frozen=True)
class Notice:
    """Something the user should know that is not an error (a saved state was damaged, …): its
    text as every front end shows it, without control characters (errors.printable), for it names
    documents."""

    text: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", printable(self.text))  # frozen: set once, here


@dataclass(frozen=True)
class Token:
    """A piece of answer text (UTF-8 complete) for one or more generated tokens."""

    text: str


@dataclass(frozen=True)
class Stats:
    model: str
    method: str
    budget: int
    prompt_tokens: int
    kept_tokens: int
    loaded_tokens: int  # of the prompt, taken from a saved reading instead of being read
    generated_tokens: int
    kv_bytes_full: int
    kv_bytes_kept: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    ttft_s: float
    total_s: float
    peak_cells: int
    stop_reason: str
    read: str = "full"  # how the prompt was read: "full", "fast 14/28 layers" (the cheap pass's), "draft small, 12/24 layers, 4,096 re-read"

    @property
    def read_tokens(self) -> int:
        """Prompt tokens the model read (decoded) for this answer."""
        return self.prompt_tokens - self.loaded_tokens

    @property
    def compression(self) -> float:
        return self.prompt_tokens / self.kept_tokens if self.kept_tokens else 1.0


@dataclass(frozen=True)
class Source:
    """A passage of the document that an answer drew on: `text` is the document's
    text[start:end], its whitespace collapsed (with several documents, offsets into their text
    together, each after a line naming it); `score` its share of the answer's attention to the
    document. `where` says where it is: a page (PDF), pages when it crosses a page break, a
    chapter (EPUB) or a line."""

    start: int
    end: int
    text: str
    score: float
    where: str
    page: int | None = None  # the PDF page (the EPUB chapter) the passage starts on
    document: str = ""  # which of several documents asked about together

    def quoted(self) -> str:
        """How front ends show it: where, then the passage."""
        return f'{self.where} · "{self.text}"'


class LaterReading(str, Enum):
    """What a document is read as after its first fast answers, for the questions after
    (AskSettings.later_reading): its passages, each alone (a passage bank), or whole."""

    WHOLE = "whole"
    PASSAGES = "passages"


@dataclass(frozen=True)
class Done:
    answer: str
    stats: Stats
    sources: tuple[Source, ...] = ()  # most relevant first; empty with sources off
    # where in the document's text the answer's attention went: its share in each of equal
    # stretches of the text (text/sources.py STRIP_CELLS), start to end; empty with sources off
    attention: tuple[float, ...] = field(default=(), repr=False)
    # the document is not read for the questions after this one yet (a fast reading answered, or its
    # parts) and no process reads it: the front end reads it so now, in the background (Engine.read_later)
    read_later: LaterReading | None = None


Event = Progress | Pruned | Evicted | Notice | Token | Done


def timed(events: Iterator[_Made], spent: Callable[[float], None]) -> Iterator[_Made]:
    """`events` passed on, `spent` told the seconds spent making each (one that raises too), and
    only those: a reading paused between two batches (for a question elsewhere, or between a
    server's other work) was not reading while its consumer held the event, and a reading's speed
    is measured by its reading time. Closing this closes `events` (a generator)."""
    try:
        while True:
            started = time.perf_counter()
            try:
                event = next(events)
            except StopIteration:
                return
            finally:
                spent(time.perf_counter() - started)
            yield event
    finally:
        if isinstance(events, Generator):
            events.close()
