"""Lock files that go when their reading ends (in_progress.py): an flock on `<key>.lock`, and who
holds it.

A lock file is removed by whoever holds its lock (the reader when done, or whoever finds it free),
while holding it. Another process may have opened the same file just before and then gets its
lock on a file no longer in the folder; so every locker checks, once locked, that the path still
names the file it locked, and starts over if not (as filelock and flufl.lock do). A lock file is
opened as atomic.open_lock_file opens one: never through a symbolic link, refused where it is not a
plain file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from kvchat.atomic import open_lock_file

PROC_LOCKS = Path("/proc/locks")  # Linux: every lock on the machine, with the process that took it


def lock(path: Path, operation: int, create: bool) -> int | None:
    """An fd of `path` holding `operation` (fcntl.LOCK_EX or LOCK_SH, with LOCK_NB not to wait),
    or None when `path` does not exist (and `create` is False) or the lock is taken (LOCK_NB)."""
    while True:
        fd = open_lock_file(path, create)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            os.close(fd)
            return None
        if _still_named(path, fd):
            return fd
        os.close(fd)  # removed (or replaced) between the open and the lock: try the file there now


def remove_and_unlock(path: Path, fd: int) -> None:
    """Remove lock file `path` whose lock `fd` holds, then release it (see the module's doc)."""
    try:
        if _still_named(path, fd):
            path.unlink()
    finally:
        os.close(fd)


def holders(path: Path) -> set[int] | None:
    """The processes holding an flock on the file at `path` (none if it is gone), as the kernel
    tells (/proc/locks); None where the system does not tell. Matched by inode alone: on btrfs and
    overlayfs /proc/locks names another device number than stat() does."""
    try:
        table = PROC_LOCKS.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        return set()
    found = set()
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 6044 fe:00:2146307 0 EOF"; a waiter's line has "->" after the number
        fields = line.split()
        if len(fields) >= 6 and "FLOCK" in fields and fields[1] != "->":
            pid, device_inode = fields[-4], fields[-3]
            if device_inode.rpartition(":")[2] == str(inode) and pid.isdigit():
                found.add(int(pid))
    return found


def _still_named(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def process_name(pid: int) -> str:
    """The name of process `pid` (its command, as ps shows it), or "?" where the system does not tell."""
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip() or "?"
    except OSError:
        return "?"
