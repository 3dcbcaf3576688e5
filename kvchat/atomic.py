"""Write files so that nothing the user keeps is ever half-written, nor an update of one lost to
another process's."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from filelock import FileLock

TEMP_SUFFIX = ".tmp"


@contextmanager
def atomic_file(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Write to a temp file beside `path`, fsync it, then rename it over `path`.

    If the body raises, the temp file is removed and `path` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(handle, mode) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp_name, path)
    finally:
        if os.path.exists(temp_name):
            os.unlink(temp_name)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the lock of `path` (a `.lock` file beside it) across a read-modify-write of it that
    other kvchat processes may be doing at once (the memo files: reading speeds, model digests)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        yield


def remove_stale_temp_files(folder: Path, name_pattern: str, older_than_s: float) -> None:
    """Delete the temp files that atomic_file left beside files named `name_pattern` (a glob) in
    `folder` when its writer was killed before the rename, once they are `older_than_s` old.

    A younger temp file may be another process's write in progress: it is kept.
    """
    cutoff = time.time() - older_than_s
    for temp in folder.glob(f"{name_pattern}.*{TEMP_SUFFIX}") if folder.is_dir() else []:
        try:
            if temp.stat().st_mtime < cutoff:
                temp.unlink()
        except OSError:  # removed meanwhile by another process, or not ours to remove
            continue
