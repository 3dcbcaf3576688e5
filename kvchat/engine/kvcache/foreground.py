"""A question goes before a background reading: while any kvchat process reads for and answers a
question (`kvchat ask`, the chat, the server), the whole readings in the background (the reader
`kvchat ask` leaves, the chat's, the server's) pause between two batches, so that they do not take
the cores the question's own reading needs, and go on when it is answered.

The questions hold `foreground.lock` shared (flock); a background reading asks for it exclusively
and gets it only while no question holds it. The kernel drops a lock when its process ends, so a
question that dies never holds a reading up. flock locks belong to an open file, not a process: a
process's own background reading pauses for its own questions too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TypeVar

from kvchat.events import Event, Progress

Ended = TypeVar("Ended")  # what a reading returns

PAUSED_CHECK_S = 0.25  # how often a paused reading looks whether the questions are answered, or it was stopped


class Foreground:
    """The questions answered now, in every kvchat process that shares the folder `root`."""

    def __init__(self, root: Path) -> None:
        self.path = root / "foreground.lock"

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Held while this process reads for a question and answers it."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def busy(self) -> bool:
        """Whether a question is answered now (a look that never waits: the server's model thread
        has other work to do)."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def giving_way(self, events: Generator[Event, None, Ended], cancel: threading.Event,
                   paused: Callable[[bool], None] = lambda _: None) -> Generator[Event, None, Ended]:
        """A whole reading's `events` (and what it returns), waiting after each batch (Progress)
        while a question is answered; `paused(True)` when such a wait begins, `paused(False)` when
        it ends and the reading goes on (not where `cancel` ended it)."""
        while True:
            try:
                event = next(events)
            except StopIteration as finished:
                return finished.value
            yield event
            if isinstance(event, Progress) and self.give_way(cancel, on_pause=lambda: paused(True)) and not cancel.is_set():
                paused(False)

    def give_way(self, cancel: threading.Event, on_pause: Callable[[], None] = lambda: None) -> bool:
        """Wait while a question is answered (or until `cancel`), calling `on_pause` once when the
        wait begins; whether this waited."""
        fd = self._open()
        waited = False
        try:
            while not cancel.is_set():
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return waited
                except BlockingIOError:
                    if not waited:
                        on_pause()
                    waited = True
                    cancel.wait(PAUSED_CHECK_S)
            return waited
        finally:
            os.close(fd)


class HeldWhileBusy:
    """The foreground held across the turns of a loop that reads and answers questions among other
    work (the server's model thread): hold(True) while a question is read or answered there."""

    def __init__(self, foreground: Foreground) -> None:
        self._foreground = foreground
        self._fd: int | None = None

    def hold(self, busy: bool) -> None:
        if busy and self._fd is None:
            self._fd = self._foreground._open()
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        elif not busy and self._fd is not None:
            os.close(self._fd)
            self._fd = None
