"""Whole readings in progress in other processes (a reading `kvchat ask` finishes in the background,
`kvchat read`, a chat's or a server's reading after a fast answer): one lock and one progress
record per reading, so that a reading is never done twice at once and `kvchat cache list|stop`
can show and stop it (read_alone).

The lock is an flock on `<key>.lock`, held by the reading process for as long as it reads: the
kernel drops it when that process ends however it ends, so a record whose lock is free is stale.
The record `<key>.json` says who reads what and how far it got; it is replaced whole each time.
Background readings take turns (`turn.lock`): each holds a context as large as its document, so
several asks about new documents read one after another rather than all at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from pathlib import Path

from kvchat.atomic import atomic_file
from kvchat.errors import raise_if_cancelled
from kvchat.events import Event, Notice, Progress

PROGRESS_EVERY_S = 0.5  # the record is rewritten at most this often
WAITING_FOR_TURN = "waiting for the background reading before it to end"  # read_alone(in_turn=True)'s notice


class WholeReadingDone(Enum):
    """How a whole reading ended (read_alone, Engine.read_whole)."""

    READ = "read"  # read and saved
    SAVED = "already saved"
    STREAMED = "too long for the model's context: read streamed for each question, never saved"


@dataclass(frozen=True)
class InProgress:
    """One reading in progress: `done` of `total` tokens read by process `pid`."""

    key: str
    document: str
    model: str
    pid: int
    done: int
    total: int
    started: float
    updated: float
    queued: bool = False  # waiting for its turn (ReadingTurn)
    stoppable: bool = True  # `kvchat cache stop` may stop it (SIGTERM): not a chat's or a server's

    @property
    def left_s(self) -> float | None:
        """Seconds left at the speed so far; None before any token is read."""
        elapsed = self.updated - self.started
        if self.done <= 0 or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / self.done


class Claim:
    """A reading this process holds the lock of: it records its progress, and releases the lock
    and the record when done (or when the process ends)."""

    def __init__(self, root: Path, lock_fd: int, record: InProgress) -> None:
        self._root, self._fd, self._record = root, lock_fd, record
        self._written_at = 0.0
        self._write()

    def progress(self, done: int, total: int) -> None:
        now = time.time()
        self._record = replace(self._record, done=done, total=total, updated=now)
        if now - self._written_at >= PROGRESS_EVERY_S or done >= total:
            self._write()

    def queued(self, waiting: bool) -> None:
        """Record that the reading waits for its turn, or no longer does."""
        now = time.time()  # the time left is told from when the reading itself began
        self._record = replace(self._record, queued=waiting, started=now, updated=now)
        self._write()

    def _write(self) -> None:
        self._written_at = time.time()
        with atomic_file(self._root / f"{self._record.key}.json") as handle:
            handle.write(json.dumps(asdict(self._record)).encode())

    def release(self) -> None:
        (self._root / f"{self._record.key}.json").unlink(missing_ok=True)
        os.close(self._fd)  # the lock goes with it

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class ReadingsInProgress:
    """The readings in progress under `root` (the user's cache directory's `reading`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def claim(self, key: str, document: str, model: str, total: int, stoppable: bool = True) -> Claim | None:
        """The lock of reading `key`, or None when another process holds it (it is reading it).
        `stoppable`: this process turns SIGTERM into stopping the reading (see stop())."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        now = time.time()
        return Claim(self.root, fd, InProgress(key, document, model, os.getpid(), 0, total, now, now, stoppable=stoppable))

    def turn(self) -> "ReadingTurn":
        """The background readings' turn (not yet taken): one of them reads at a time."""
        self.root.mkdir(parents=True, exist_ok=True)
        return ReadingTurn(os.open(self.root / "turn.lock", os.O_RDWR | os.O_CREAT, 0o600))

    def find(self, key: str) -> InProgress | None:
        """Reading `key` if a live process is reading it."""
        return next((entry for entry in self.entries() if entry.key == key), None)

    def entries(self) -> list[InProgress]:
        """The readings in progress, oldest first; stale records (their process gone) are removed."""
        found = []
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            record = _record(path)
            if record is None or not self._held(record.key):
                path.unlink(missing_ok=True)
                continue
            found.append(record)
        return sorted(found, key=lambda entry: entry.started)

    def _held(self, key: str) -> bool:
        try:
            fd = os.open(self.root / f"{key}.lock", os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def wait(self, key: str) -> None:
        """Block until no process reads `key` (returns at once if none does)."""
        try:
            fd = os.open(self.root / f"{key}.lock", os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)

    def follow(self, key: str, cancel: threading.Event | None = None) -> Iterator[InProgress]:
        """The record of reading `key`, every PROGRESS_EVERY_S until its process ends (or `cancel`
        is set): the lock is awaited in a thread, the record read between."""
        ended = threading.Event()
        threading.Thread(target=lambda: (self.wait(key), ended.set()), name="kvchat-follow-reading", daemon=True).start()
        while not ended.wait(PROGRESS_EVERY_S):
            if cancel is not None and cancel.is_set():
                return
            if (record := _record(self.root / f"{key}.json")) is not None:
                yield record

    def progress_of(self, key: str, cancel: threading.Event | None = None) -> Iterator[Progress]:
        """Another process's reading of `key` as Progress events (follow())."""
        for record in self.follow(key, cancel):
            yield Progress(done=record.done, total=record.total, elapsed_s=record.updated - record.started)

    def stop(self) -> list[InProgress]:
        """Ask every stoppable reading's process to stop (SIGTERM: it stops between batches and
        saves nothing); the readings asked. A chat's or a server's reading is its own to stop."""
        stopped = []
        for entry in (entry for entry in self.entries() if entry.stoppable):
            try:
                os.kill(entry.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            stopped.append(entry)
        return stopped


class ReadingTurn:
    """The flock on `turn.lock` that background readings take turns holding; released on exit."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def take(self) -> bool:
        """Take the turn if no other reading holds it; whether it was taken."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def wait(self, cancel: threading.Event | None = None) -> None:
        """Take the turn when the reading that holds it ends, trying every PROGRESS_EVERY_S; a set
        `cancel` stops the wait."""
        stopped = cancel or threading.Event()  # waited on between tries: a set cancel ends the wait at once
        while not self.take():
            if stopped.wait(PROGRESS_EVERY_S):
                raise_if_cancelled(cancel)

    def __enter__(self) -> "ReadingTurn":
        return self

    def __exit__(self, *_exc: object) -> None:
        os.close(self._fd)


def read_alone(
    readings: ReadingsInProgress, claimant: tuple[str, str, str, int], saved: Callable[[], bool],
    read: Callable[[], Iterator[Event]], cancel: threading.Event | None = None, *, in_turn: bool = False,
    stoppable: bool = False,
) -> Generator[Event, None, WholeReadingDone]:
    """`read()` a document whole holding its reading's lock, unless `saved()`: so no two
    processes read it at once. `claimant`: (key, document, model, tokens) of the reading. While
    another process holds the lock, its progress is followed and the lock tried again; one that
    only waits for its turn is not waited for (it finds the reading saved when its turn comes).
    `in_turn`: wait for the background readings' turn before reading (one reads at a time)."""
    key = claimant[0]
    while not saved():
        claim = readings.claim(*claimant, stoppable=stoppable)
        if claim is not None:
            with claim:
                return (yield from _claimed(readings, claim, saved, read, cancel, in_turn))
        other = readings.find(key)
        if other is not None and other.queued:
            yield from read()
            return WholeReadingDone.READ
        yield Notice(f"another kvchat process is reading {claimant[1]}; waiting for it")
        yield from readings.progress_of(key, cancel)
        raise_if_cancelled(cancel)
    return WholeReadingDone.SAVED


def _claimed(readings: ReadingsInProgress, claim: Claim, saved: Callable[[], bool], read: Callable[[], Iterator[Event]],
             cancel: threading.Event | None, in_turn: bool) -> Generator[Event, None, WholeReadingDone]:
    """read_alone's reading, its lock taken: in its turn if asked, and unless it was saved meanwhile."""
    with readings.turn() if in_turn else contextlib.nullcontext() as turn:
        if turn is not None and not turn.take():
            claim.queued(True)
            yield Notice(WAITING_FOR_TURN)
            turn.wait(cancel)
            claim.queued(False)
        if saved():  # saved before the lock was taken, or while this one waited for its turn
            return WholeReadingDone.SAVED
        for event in read():
            if isinstance(event, Progress):
                claim.progress(event.done, event.total)
            yield event
    return WholeReadingDone.READ


def _record(path: Path) -> InProgress | None:
    """The record at `path`; fields it does not know (a newer kvchat's) are left aside."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {field.name for field in fields(InProgress)}
        return InProgress(**{name: value for name, value in data.items() if name in known})
    except (OSError, ValueError, TypeError, AttributeError):
        return None
