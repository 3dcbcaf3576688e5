"""Whole readings in progress in other processes (a reading `kvchat ask` finishes in the background):
one lock and one progress record per reading, so that a reading is never done twice at once and
`kvchat cache list|stop` can show and stop it.

The lock is an flock on `<key>.lock`, held by the reading process for as long as it reads: the
kernel drops it when that process ends however it ends, so a record whose lock is free is stale.
The record `<key>.json` says who reads what and how far it got; it is replaced whole each time.
Background readings take turns (`turn.lock`): each holds a context as large as its document, so
several asks about new documents read one after another rather than all at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from kvchat.atomic import atomic_file
from kvchat.errors import raise_if_cancelled

PROGRESS_EVERY_S = 0.5  # the record is rewritten at most this often


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

    def claim(self, key: str, document: str, model: str, total: int) -> Claim | None:
        """The lock of reading `key`, or None when another process holds it (it is reading it)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        now = time.time()
        return Claim(self.root, fd, InProgress(key, document, model, os.getpid(), 0, total, now, now))

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

    def stop(self) -> list[InProgress]:
        """Ask every reading process to stop (SIGTERM: it stops between batches and saves
        nothing); the readings asked."""
        stopped = []
        for entry in self.entries():
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
        """Take the turn when the reading that holds it ends. The lock is awaited in a thread, so
        that a set `cancel` is seen meanwhile (a wait stopped so ends the process, and the thread's
        wait with it)."""
        taken = threading.Event()
        threading.Thread(target=lambda: (fcntl.flock(self._fd, fcntl.LOCK_EX), taken.set()), name="kvchat-turn",
                         daemon=True).start()
        while not taken.wait(PROGRESS_EVERY_S):
            raise_if_cancelled(cancel)

    def __enter__(self) -> "ReadingTurn":
        return self

    def __exit__(self, *_exc: object) -> None:
        os.close(self._fd)


def _record(path: Path) -> InProgress | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return InProgress(**data)
    except (OSError, ValueError, TypeError):
        return None
