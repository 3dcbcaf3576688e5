"""Whole readings in progress in other processes (a reading `kvchat ask` finishes in the background,
`kvchat read`, a chat's or a server's reading after a fast answer): one lock and one progress
record per reading, so that a reading is never done twice at once and `kvchat cache list|stop`
can show and stop it (read_alone).

The lock is an flock on `<key>.lock`, held by the reading process for as long as it reads: the
kernel drops it when that process ends however it ends, so a record whose lock is free is stale.
The lock file goes with the reading (lock_files.py). The record `<key>.json` says who reads what
and how far it got; it is replaced whole each time. A record is shown, and its process stopped,
only while it is what kvchat writes (progress_record.py) and its process holds the lock.
Background readings take turns (`turn.lock`): each holds a context as large as its document, so
several asks about new documents read one after another rather than all at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path

from kvchat.atomic import atomic_file, open_lock_file
from kvchat.engine.kvcache.lock_files import holders, lock, remove_and_unlock
from kvchat.engine.kvcache.progress_record import KEY_FORM, BadRecord, InProgress, read_record
from kvchat.errors import raise_if_cancelled
from kvchat.engine.kvcache.foreground import foreground_of
from kvchat.events import Event, Notice, Progress, timed

LOGGER = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5  # the record is rewritten at most this often
WAITING_FOR_TURN = "waiting for the background reading before it to end"  # read_alone(in_turn=True)'s notice


class WholeReadingDone(Enum):
    """How a whole reading ended (read_alone, Engine.read_whole)."""

    READ = "read"  # read and saved
    SAVED = "already saved"
    UNSAVED = "read, but its reading could not be saved"  # the disk full, say (Engine.read_whole)
    STREAMED = "too long for the model's context: read streamed for each question, never saved"


class Claim:
    """A reading this process holds the lock of: it records its progress, and releases the lock
    and the record when done (or when the process ends)."""

    def __init__(self, root: Path, lock_fd: int, record: InProgress) -> None:
        self._root, self._fd, self._record = root, lock_fd, record
        self._written_at = 0.0
        self._since_told_s = 0.0  # reading time since the last progress (events.timed)
        self._told = False
        self._write()

    def spent_reading(self, seconds: float) -> None:
        self._since_told_s += seconds

    def progress(self, done: int, total: int) -> None:
        """`done` of `total` read. The time left is told from the tokens read since the first
        progress and the time that read them: not what came before it (a saved part loaded), nor
        a batch stopped part-way for a question (its progress told again, unchanged), which is
        read again after it."""
        now = time.time()
        if not self._told:
            self._record = replace(self._record, read_from=done)
        elif done > self._record.done:
            self._record = replace(self._record, read_s=self._record.read_s + self._since_told_s)
        self._told, self._since_told_s = True, 0.0
        self._record = replace(self._record, done=done, total=total, updated=now)
        if now - self._written_at >= PROGRESS_EVERY_S or done >= total:
            self._write()

    def queued(self, waiting: bool) -> None:
        """Record that the reading waits for its turn, or no longer does."""
        now = time.time()  # `started`: when the reading itself began
        self._record = replace(self._record, queued=waiting, started=now, updated=now)
        self._write()

    def _write(self) -> None:
        self._written_at = time.time()
        with atomic_file(self._root / f"{self._record.key}.json") as handle:
            handle.write(json.dumps(asdict(self._record)).encode())

    def release(self) -> None:
        """Remove the record, then the lock file, holding the lock until both are gone."""
        (self._root / f"{self._record.key}.json").unlink(missing_ok=True)
        remove_and_unlock(self._root / f"{self._record.key}.lock", self._fd)

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class Survey:
    """The readings in progress (`live`), and a line for each record removed as untrustworthy."""

    live: list[InProgress]
    removed: list[str]


class ReadingsInProgress:
    """The readings in progress under `root` (the user's cache directory's `reading`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.foreground = foreground_of(root)  # the questions answered now: background readings pause for them

    def claim(self, key: str, document: str, model: str, total: int, stoppable: bool = True) -> Claim | None:
        """The lock of reading `key`, or None when another process holds it (it is reading it).
        `stoppable`: this process turns SIGTERM into stopping the reading (see stop())."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = lock(self._lock_path(key), fcntl.LOCK_EX | fcntl.LOCK_NB, create=True)
        if fd is None:
            return None
        now = time.time()
        return Claim(self.root, fd, InProgress(key, document, model, os.getpid(), 0, total, now, now, stoppable=stoppable))

    def turn(self) -> "ReadingTurn":
        """The background readings' turn (not yet taken): one of them reads at a time."""
        fd = open_lock_file(self.root / "turn.lock")
        assert fd is not None  # made where missing
        return ReadingTurn(fd)

    def find(self, key: str) -> InProgress | None:
        """Reading `key` if a live process is reading it."""
        return next((entry for entry in self.entries() if entry.key == key), None)

    def entries(self) -> list[InProgress]:
        """The readings in progress, oldest first (survey())."""
        return self.survey().live

    def survey(self) -> Survey:
        """The readings in progress, oldest first. A stale record (its process gone) is removed with
        its lock file; so is one that is not what kvchat writes, or whose process does not hold
        its lock, and that one is reported too."""
        live, removed = [], []
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            try:
                record = self._trusted(path)
            except BadRecord as bad:
                path.unlink(missing_ok=True)
                LOGGER.warning("removed the progress record %s: %s", path, bad)
                removed.append(f"removed {path}: not a record of a kvchat reading ({bad})")
                continue
            if record is not None:
                live.append(record)
        self._remove_free_locks()
        return Survey(sorted(live, key=lambda entry: entry.started), removed)

    def _trusted(self, path: Path) -> InProgress | None:
        """The record at `path` if its reading is in progress; None if it ended (its record and
        lock file are removed then). BadRecord when it must not be trusted."""
        try:
            record = read_record(path)
        except OSError:  # removed meanwhile: that reading ended
            return None
        if self._removed_if_free(record.key):
            return None
        holding = holders(self._lock_path(record.key))
        if holding is not None and record.pid not in holding:  # None: a system that does not tell
            raise BadRecord(f"process {record.pid} does not hold the reading's lock")
        return record

    def _removed_if_free(self, key: str) -> bool:
        """Whether no process holds the lock of reading `key`; then its record and lock file are
        removed, holding the lock, so that no new reading of it can lose its own."""
        fd = lock(self._lock_path(key), fcntl.LOCK_EX | fcntl.LOCK_NB, create=True)
        if fd is None:
            return False
        (self.root / f"{key}.json").unlink(missing_ok=True)
        remove_and_unlock(self._lock_path(key), fd)
        return True

    def _remove_free_locks(self) -> None:
        """Remove the lock files of readings that ended without removing theirs (a reader killed
        between removing its record and its lock file, or an earlier kvchat, which kept them all)."""
        for path in self.root.glob("*.lock"):
            if KEY_FORM.fullmatch(path.stem) and not path.with_suffix(".json").exists():
                self._removed_if_free(path.stem)

    def _lock_path(self, key: str) -> Path:
        return self.root / f"{key}.lock"

    def wait(self, key: str) -> None:
        """Block until no process reads `key` (returns at once if none does)."""
        fd = lock(self._lock_path(key), fcntl.LOCK_SH, create=False)
        if fd is not None:
            os.close(fd)

    def follow(self, key: str, cancel: threading.Event | None = None) -> Iterator[InProgress]:
        """The record of reading `key`, every PROGRESS_EVERY_S until its process ends (or `cancel`
        is set): the lock is awaited in a thread, the record read between."""
        ended = threading.Event()
        threading.Thread(target=lambda: (self.wait(key), ended.set()), name="kvchat-follow-reading", daemon=True).start()
        while not ended.wait(PROGRESS_EVERY_S):
            if cancel is not None and cancel.is_set():
                return
            try:
                record = read_record(self.root / f"{key}.json")
            except (OSError, BadRecord):  # between readings, or not one to show
                continue
            yield record

    def progress_of(self, key: str, cancel: threading.Event | None = None) -> Iterator[Progress]:
        """Another process's reading of `key` as Progress events (follow())."""
        for record in self.follow(key, cancel):
            yield Progress(done=record.done, total=record.total, elapsed_s=record.read_s, read_from=record.read_from)

    def stop(self, survey: Survey) -> list[InProgress]:
        """Ask the process of every stoppable reading in `survey` (just taken: each of its
        processes holds its reading's lock) to stop (SIGTERM: it stops part-way through its batch
        and saves nothing); the readings asked. A chat's or a server's reading is its own to stop."""
        stopped = []
        for entry in (entry for entry in survey.live if entry.stoppable):
            try:
                os.kill(entry.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):  # ended since, or another user's
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
    stoppable: bool = False, awaits_own: bool = True,
) -> Generator[Event, None, WholeReadingDone]:
    """`read()` a document whole holding its reading's lock, unless `saved()`: so no two
    processes read it at once. `claimant`: (key, document, model, tokens) of the reading. While
    another process holds the lock, its progress is followed and the lock tried again; one that
    only waits for its turn is not waited for (it finds the reading saved when its turn comes).
    `in_turn`: wait for the background readings' turn before reading (one reads at a time).
    `awaits_own` False: a reading of this process's own is not waited for either (a question's
    reading, Conversation.open: the server reads its requests by turns on one thread, which such a
    wait would hold up)."""
    key = claimant[0]
    while not saved():
        claim = readings.claim(*claimant, stoppable=stoppable)
        if claim is not None:
            with claim:
                return (yield from _claimed(readings, claim, saved, read, cancel, in_turn))
        other = readings.find(key)
        if other is not None and (other.queued or (not awaits_own and other.pid == os.getpid())):
            yield from read()
            return WholeReadingDone.READ
        yield Notice(f"another kvchat process is reading {claimant[1]}; waiting for it")
        with readings.foreground.stepping_aside():  # that reading must not pause for the question awaiting it
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
        for event in timed(read(), claim.spent_reading):
            if isinstance(event, Progress):
                claim.progress(event.done, event.total)
            yield event
    return WholeReadingDone.READ

