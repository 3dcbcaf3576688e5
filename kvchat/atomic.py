"""Write files so that nothing the user keeps is ever half-written, nor an update of one lost to
another process's; and open the lock files kvchat keeps beside them.

A file is written to a temp file beside it, which its writer holds an flock on from its making to
its rename: a temp file that no process holds is a dead writer's (killed before the rename), and
remove_dead_temp_files removes it at once; a live writer's, in any process, is kept.

A lock file is opened read-only (flock needs no more), without following a symbolic link, and only
where it is a plain file: a link kvchat did not make would have it create, open and lock another
file, /etc/passwd for root. Anything else where a lock file belongs is refused in one line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from kvchat.paths import foreign

TEMP_SUFFIX = ".tmp"
LOCK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a named pipe there never hangs the open


@contextmanager
def atomic_file(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Write to a temp file beside `path`, locked while it is written, fsync it, then rename it over
    `path`. If the body raises, the temp file is removed and `path` is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = _locked_temp(path)
    held = os.dup(handle)  # the lock, held past the write's close until the rename is done
    try:
        with os.fdopen(handle, mode) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp_name, path)
    finally:
        try:
            if os.path.exists(temp_name):
                os.unlink(temp_name)
        finally:
            os.close(held)


def _locked_temp(path: Path) -> tuple[int, str]:
    """A new temp file beside `path`, open and locked. A sweep (remove_dead_temp_files) may find it
    between its making and its lock, take it for a dead writer's and remove it: then it is made anew."""
    while True:
        handle, name = tempfile.mkstemp(prefix=path.name + ".", suffix=TEMP_SUFFIX, dir=path.parent)
        fcntl.flock(handle, fcntl.LOCK_EX)
        if _names(Path(name), handle):
            return handle, name
        os.close(handle)


def remove_dead_temp_files(folder: Path, name_pattern: str) -> None:
    """Delete the temp files that atomic_file left beside files named `name_pattern` (a glob) in
    `folder` when its writer was killed before the rename: those no process holds the lock of. A
    live writer's (any process's) is kept; so is what is not a plain file."""
    for temp in folder.glob(f"{name_pattern}.*{TEMP_SUFFIX}") if folder.is_dir() else []:
        try:
            if stat.S_ISREG(os.lstat(temp).st_mode):
                _remove_if_dead(temp)
        except OSError:  # removed meanwhile by another process, or not ours to remove
            continue


def _remove_if_dead(temp: Path) -> None:
    """Remove temp file `temp` unless its writer holds its lock (holding it meanwhile)."""
    fd = os.open(temp, LOCK_FLAGS)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live writer's
            return
        if _names(temp, fd):
            temp.unlink()
    finally:
        os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def open_lock_file(path: Path, create: bool = True) -> int | None:
    """An fd of lock file `path`, to flock (nothing is read from it or written to it), made where
    it is missing if `create`; None where it is missing and not to be made. Raises HomeError naming
    `path` where something else than a plain file is there (see the module's doc), OSError where
    its folder cannot be written."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        kind = _not_plain(os.lstat(path))  # before the open: a device is never opened
    except FileNotFoundError:
        kind = None
    if kind is not None:
        raise foreign(path, kind)
    try:
        fd = os.open(path, LOCK_FLAGS | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:  # O_NOFOLLOW met a link made since the look
            raise foreign(path, "a symbolic link") from None
        raise
    kind = _not_plain(os.fstat(fd))
    if kind is not None:
        os.close(fd)
        raise foreign(path, kind)
    return fd


def _not_plain(found: os.stat_result) -> str | None:
    """What a file is where it is not a plain file ("a symbolic link", "a folder"); None for a plain one."""
    mode = found.st_mode
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"),
             (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), "a device")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the lock of `path` (a `.lock` file beside it) across a read-modify-write of it that
    other kvchat processes may be doing at once (the memo files: reading speeds, model digests)."""
    fd = open_lock_file(Path(f"{path}.lock"))
    assert fd is not None  # made where missing
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
