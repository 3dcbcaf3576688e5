"""Documents uploaded or answered from a fast reading, read on the model thread while it has
nothing else to do as their follow-ups need them (LaterReading: as their passages, a passage bank
from which a follow-up loads the passages it chooses, or whole, a follow-up then selected from that
reading), and saved.

The scheduler reads one batch at a time, only while no answer is in progress and no request is
read or waits (a new request is admitted before the next batch). A question about a document whose
reading is under way (a follow-up too) is read fast as it chooses, where a fast reading pays and is
sooner than the rest of that reading, and the whole reading goes on after it; any other request
first reads the rest of it, taking turns with the other readings as its own reading would, then
loads it. Without saved readings (`--no-cache`) there
is nowhere to keep a reading for a later request, and none is started.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

from kvchat.engine import Engine, KvLayout
from kvchat.events import Event, LaterReading, Progress
from kvchat.serving.requests import ChatRequest

LOGGER = logging.getLogger(__name__)

DocumentKey = tuple[str, KvLayout]  # a document's text, and the cache layout its reading is saved in
ReadLater = Callable[[Engine, ChatRequest, LaterReading], Iterator[Event]]  # read_later (a fake engine's, in tests)


def _key(request: ChatRequest) -> DocumentKey | None:
    return None if request.document is None else (request.document.text, request.settings.layout)


def read_later(engine: Engine, request: ChatRequest, later: LaterReading) -> Iterator[Event]:
    """Read `request`'s document as `later` says (its passages, or whole) and save that, a batch
    per step (Engine.read_later: under the reading's lock, so a `kvchat ask` reading it in the
    background is waited for, not doubled). Dropped unfinished (close() of this generator), it saves nothing."""
    assert request.document is not None
    yield from engine.read_later(request.document, request.settings, later)


class BackgroundReadings:
    """The readings for later questions still to do, oldest first; used by the model thread only."""

    def __init__(self, engine: Engine, reader: ReadLater = read_later) -> None:
        self.engine = engine
        self._reader = reader
        self._pending: dict[DocumentKey, Iterator[Event]] = {}
        self._read: dict[DocumentKey, dict[str, object]] = {}  # how far each has got, for /health

    def __len__(self) -> int:
        return len(self._pending)

    def progress(self) -> list[dict[str, object]]:
        """Each reading under way: its document's name, what it reads (LaterReading: "passages" or
        "whole"), tokens read and in all (read from the server's threads: a copy made in one step)."""
        return list(self._read.values())

    def add(self, request: ChatRequest, later: LaterReading) -> None:
        """Read `request`'s document as `later` says, unless it is under way or cannot be saved."""
        key = _key(request)
        if key is not None and key not in self._pending and self.engine.states is not None:
            self._pending[key] = self._reader(self.engine, request, later)
            assert request.document is not None
            self._read[key] = {"document": request.document.path.name, "reads": later.value, "done": 0, "total": 0}

    def step(self) -> None:
        """Read on with the oldest reading: one batch (or another event of it)."""
        key, events = next(iter(self._pending.items()))
        self._advance(key, events)

    def rest_of(self, request: ChatRequest, cancel: threading.Event) -> Iterator[Event]:
        """Before `request` is prepared: the rest of its document's reading, if one is under way,
        an event at a time, unless the request's own reading comes first (a question read fast,
        as it chooses: the whole reading goes on after it). Stops when `cancel` is
        set (the request's: its client went, or the server stops)."""
        key = _key(request)
        if key in self._pending and self._fast_is_sooner(request, key):
            return
        while key in self._pending and not cancel.is_set():
            if (event := self._advance(key, self._pending[key])) is not None:
                yield event

    def _fast_is_sooner(self, request: ChatRequest, key: DocumentKey) -> bool:
        """Whether `request` reads fast (as the question chooses) before the rest of its
        document's reading: where a fast reading pays and is sooner than that rest."""
        assert request.document is not None
        read = int(self._read[key]["done"])  # type: ignore[call-overload]
        return self.engine.plan(request.document, request.settings).reads_fast_before_the_rest(read)

    def close(self) -> None:
        """Drop the readings not done (their contexts are freed)."""
        for events in self._pending.values():
            events.close()
        self._pending.clear()
        self._read.clear()

    def _advance(self, key: DocumentKey, events: Iterator[Event]) -> Event | None:
        """The reading's next event; None once it ended (or failed)."""
        try:
            event = next(events)
        except StopIteration:
            del self._pending[key], self._read[key]
        except Exception:  # the reading is dropped; a follow-up reads the document itself
            LOGGER.exception("reading a document whole in the background failed")
            del self._pending[key], self._read[key]
        else:
            if isinstance(event, Progress):
                self._read[key] = {**self._read[key], "done": event.done, "total": event.total}
            return event
        return None
