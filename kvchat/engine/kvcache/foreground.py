"""A question goes before a background reading: while any kvchat process reads for and answers a
question (`kvchat ask`, the chat, the server), the whole readings in the background (the reader
`kvchat ask` leaves, the chat's, the server's) stop the batch under way part-way and pause, so
that they do not take the cores the question's own reading needs, and go on when it is answered.

The questions hold `foreground.lock` shared (flock); a background reading asks for it exclusively
and gets it only while no question holds it. The kernel drops a lock when its process ends, so a
question that dies never holds a reading up. flock locks belong to an open file, not a process: a
process's own background reading pauses for its own questions too. A question that awaits
another process's whole reading of its document steps aside while it waits (in_progress.read_alone),
or the two would wait for each other.

Only a look (busy()) takes the lock exclusively, for a few microseconds: a question kept waiting
longer by another process holding it says which process, once, after WAIT_TOLD_S. Where the lock
file cannot be made (its folder read-only or not the user's, `cache` off), no background reading can
run there either (each makes it too): a question goes on without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TypeVar

from kvchat.atomic import open_lock_file
from kvchat.engine.kvcache.lock_files import holders, process_name
from kvchat.events import Event, Progress
from kvchat.paths import is_unwritable

LOGGER = logging.getLogger(__name__)

Ended = TypeVar("Ended")  # what a reading returns

PAUSED_CHECK_S = 0.25  # how often a paused reading looks whether the questions are answered, or it was stopped
LOOK_EVERY_S = 0.02  # how often a batch under way looks whether a question came (Foreground.lately_busy)
WAIT_TOLD_S = 1.0  # a question kept this long from the lock says what holds it (a look holds it microseconds)
LOCK_RETRY_S = 0.05  # how often a question kept from the lock tries it again
Told = Callable[[str], None]  # how a front end tells the user a line (Foreground.answering)


class Foreground:
    """The questions answered now, in every kvchat process that shares the folder `root`. This
    process's questions share one open lock file: the lock is held while any of them is answered,
    unless one of them steps aside (stepping_aside)."""

    def __init__(self, root: Path) -> None:
        self.path = root / "foreground.lock"
        self._guard = threading.Lock()
        self._questions = 0  # this process's questions answered now
        self._aside = 0  # of them, those awaiting another process's reading
        self._held = False  # the shared lock is held (or, its file impossible to make, taken as held)
        self._fd: int | None = None  # the shared lock's file, while held
        self._looked = (-LOOK_EVERY_S, False)  # when busy() last looked, and what it saw

    def _open(self) -> int | None:
        """The lock file, opened (atomic.open_lock_file: never through a link); None where it is
        missing and cannot be made (see the module's doc)."""
        try:
            return open_lock_file(self.path)
        except OSError as error:
            if is_unwritable(error):
                return None
            raise

    def _update(self, told: Told) -> None:
        """Hold the shared lock while a question is answered and none steps aside (under _guard)."""
        wanted = self._questions > 0 and self._aside == 0
        if wanted and not self._held:
            fd = self._open()
            if fd is not None:
                try:
                    self._share(fd, told)
                except BaseException:
                    os.close(fd)
                    raise
            self._fd, self._held = fd, True
        elif not wanted and self._held:
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self._held = None, False

    def _share(self, fd: int, told: Told) -> None:
        """Take the lock shared, waiting while another process holds it; after WAIT_TOLD_S of
        waiting, `told` once what it waits for (see the module's doc)."""
        began: float | None = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            if began is not None and time.monotonic() - began >= WAIT_TOLD_S:
                told(self.waiting_for())
                began = None
            time.sleep(LOCK_RETRY_S)

    def waiting_for(self) -> str:
        """What a question kept from the lock waits for, and how to end the wait: the processes
        holding the lock, as the kernel tells."""
        pids = sorted((holders(self.path) or set()) - {os.getpid()})
        if not pids:
            return f"waiting for another process to release {self.path}, which kvchat's questions share; end that process to go on"
        named = ", ".join(f"process {pid} ({process_name(pid)})" for pid in pids)
        return (f"waiting for {named} to release {self.path}, which kvchat's questions share; "
                f"end {'it' if len(pids) == 1 else 'them'} (kill {' '.join(map(str, pids))}) to go on")

    def _count(self, questions: int = 0, aside: int = 0, told: Told = LOGGER.warning) -> None:
        """Count a question in or out (or one stepping aside), and hold the lock as they say; where
        the lock cannot be taken, the count is as before."""
        with self._guard:
            self._questions += questions
            self._aside += aside
            try:
                self._update(told)
            except BaseException:
                self._questions -= questions
                self._aside -= aside
                raise

    @contextlib.contextmanager
    def answering(self, told: Told = LOGGER.warning) -> Iterator[None]:
        """Held while this process reads for a question and answers it; `told`: how the user is
        told what the question waits for, where another process keeps it waiting."""
        self._count(questions=1, told=told)
        try:
            yield
        finally:
            self._count(questions=-1)

    @contextlib.contextmanager
    def stepping_aside(self) -> Iterator[None]:
        """While a question here awaits another process's whole reading of its document: that
        reading must not wait for this process's questions, or both would wait for ever."""
        self._count(aside=1)
        try:
            yield
        finally:
            self._count(aside=-1)

    def busy(self) -> bool:
        """Whether a question is answered now (a look that never waits: the server's model thread
        has other work to do)."""
        fd = self._open()
        if fd is None:  # no question can hold it either
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            busy = False
        except BlockingIOError:
            busy = True
        finally:
            os.close(fd)
        self._looked = (time.monotonic(), busy)
        return busy

    def lately_busy(self) -> bool:
        """busy(), looked at most every LOOK_EVERY_S: llama.cpp asks between every two nodes of a
        batch's graph (batches_stop_while), and a look is four system calls."""
        at, busy = self._looked
        return busy if time.monotonic() - at < LOOK_EVERY_S else self.busy()

    def giving_way(self, events: Generator[Event, None, Ended], cancel: threading.Event,
                   paused: Callable[[bool], None] = lambda _: None) -> Generator[Event, None, Ended]:
        """A whole reading's `events` (and what it returns), waiting after each batch (Progress)
        while a question is answered; `paused(True)` when such a wait begins, `paused(False)` when
        it ends and the reading goes on (not where `cancel` ended it). A batch under way when a
        question comes stops part-way and is read again after it (batches_stop_while)."""
        while True:
            try:
                with batches_stop_while(self.lately_busy):  # a question's arrival stops the batch under way part-way
                    event = next(events)
            except StopIteration as finished:
                return finished.value
            yield event
            if isinstance(event, Progress) and self.give_way(cancel, on_pause=lambda: paused(True)) and not cancel.is_set():
                paused(False)

    def give_way(self, cancel: threading.Event, on_pause: Callable[[], None] = lambda: None) -> bool:
        """Wait while a question is answered (or until `cancel`), calling `on_pause` once when the
        wait begins; whether this waited. busy() remembers its last look, so the batch read next
        does not stop at once (lately_busy)."""
        waited = False
        while not cancel.is_set() and self.busy():
            if not waited:
                on_pause()
            waited = True
            cancel.wait(PAUSED_CHECK_S)
        return waited


_BATCHES = threading.local()  # what stops the batches read in this thread part-way (batches_stop_while)


@contextlib.contextmanager
def batches_stop_while(check: Callable[[], bool]) -> Iterator[None]:
    """The batches a reading reads in this thread meanwhile stop part-way while `check()` holds
    (a question is answered, a request waits): KvCache.prefill reads such a batch again after
    telling its progress, where the reading gives way. Without it, a batch under way ends first:
    12 s for 512 tokens at 11K on a slow 2-core CPU, beside the question's own reading."""
    before = getattr(_BATCHES, "check", None)
    _BATCHES.check = check
    try:
        yield
    finally:
        _BATCHES.check = before


def batch_stop(cancel: threading.Event | None) -> Callable[[], bool] | None:
    """What stops a batch read in this thread now part-way: `cancel`, or the thread's check
    (batches_stop_while; a reading begun in the background may go on for a question, in the
    question's thread, where nothing stops it but its cancel); None: nothing does."""
    check = getattr(_BATCHES, "check", None)
    if cancel is None and check is None:
        return None
    return lambda: (cancel is not None and cancel.is_set()) or (check is not None and check())


_FOREGROUNDS: dict[Path, Foreground] = {}
_FOREGROUNDS_GUARD = threading.Lock()


def foreground_of(root: Path) -> Foreground:
    """This process's Foreground of `root`: one for all its holders (`kvchat ask` holds it from its
    start, before its engine's reading does; a question steps aside for all of them)."""
    with _FOREGROUNDS_GUARD:
        return _FOREGROUNDS.setdefault(root, Foreground(root))


class HeldWhileBusy:
    """The foreground held across the turns of a loop that reads and answers questions among other
    work (the server's model thread): hold(True) while a question is read or answered there."""

    def __init__(self, foreground: Foreground) -> None:
        self._foreground = foreground
        self._held = False

    def hold(self, busy: bool) -> None:
        if busy != self._held:
            self._foreground._count(questions=1 if busy else -1)
            self._held = busy
