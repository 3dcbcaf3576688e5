"""The progress record of a reading in progress (`<key>.json` beside its lock, in_progress.py), and
the checks a record passes before anything is shown or signalled from it.

A record is only read, never trusted: `kvchat cache stop` sends its `pid` SIGTERM, so a record that
is not exactly what kvchat writes (a key of another form or another file's, a pid that is not a
positive process id, a count or a time of the wrong type) is refused with a reason.
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass, fields
from pathlib import Path

KEY_FORM = re.compile(r"[0-9a-f]{40}")  # DocumentStates.key(): a sha256's first 40 hex digits
PID_MAX = 2**22  # Linux's PID_MAX_LIMIT; other systems' pids are smaller
COUNT_MAX = 2**53  # tokens: far above any document, and exact as a JSON number
TIME_MAX = 2.0**40  # seconds since 1970: the year 36812


class BadRecord(ValueError):
    """A progress record that is not kvchat's; the message says why."""


@dataclass(frozen=True)
class InProgress:
    """One reading in progress: `done` of `total` tokens read by process `pid`; it began reading at
    `read_from` and has spent `read_s` seconds reading since (not waiting for its turn, nor paused
    for a question), which is what the time left is told from."""

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
    read_from: int = 0
    read_s: float = 0.0

    @property
    def tokens_per_s(self) -> float | None:
        """Its speed so far; None before a batch is read."""
        if self.done <= self.read_from or self.read_s <= 0:
            return None
        return (self.done - self.read_from) / self.read_s

    @property
    def left_s(self) -> float | None:
        """Seconds left at the speed so far; None before a batch is read."""
        speed = self.tokens_per_s
        return None if speed is None else (self.total - self.done) / speed


def read_record(path: Path) -> InProgress:
    """The record at `path`; fields it does not know (a newer kvchat's) are left aside. Raises
    OSError when it cannot be read, BadRecord when it is not a record kvchat wrote as `path`."""
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError; nested too deep
        raise BadRecord(f"not JSON ({error})") from None
    if not isinstance(data, dict):
        raise BadRecord(f"not a JSON object: {reprlib.repr(data)}")
    known = {field.name for field in fields(InProgress)}
    values = {name: value for name, value in data.items() if name in known}
    missing = sorted(known - set(values) - {"queued", "stoppable", "read_from", "read_s"})
    if missing:
        raise BadRecord(f"no {', '.join(missing)}")
    for name, value in values.items():
        if not _fits(name, value):
            raise BadRecord(f"{name} is {reprlib.repr(value)}")
    if values["key"] != path.stem:
        raise BadRecord(f"key {values['key']!r} is not its file's name")
    return InProgress(**values)


def _fits(name: str, value: object) -> bool:
    """Whether `value` is what kvchat writes as field `name`."""
    if name == "key":
        return isinstance(value, str) and KEY_FORM.fullmatch(value) is not None
    if name in ("document", "model"):
        return isinstance(value, str)
    if name in ("queued", "stoppable"):
        return isinstance(value, bool)
    if name == "pid":
        return _whole(value) and 0 < value <= PID_MAX
    if name in ("done", "total", "read_from"):
        return _whole(value) and 0 <= value <= COUNT_MAX
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= TIME_MAX  # NaN fails too


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
