"""Where kvchat keeps its files. `KVCHAT_HOME` overrides every path (tests, portable installs).

A folder of kvchat's that cannot be used (read-only, full, not the user's to write) or that holds
something kvchat did not make where it keeps a file of its own is a HomeError: one line naming the
folder (or the file) and where it comes from, KVCHAT_HOME or the platform's folders."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from platformdirs import user_cache_dir, user_config_dir, user_data_dir, user_log_dir

from kvchat.errors import KvchatError

APP_NAME = "kvchat"
HOME_ENV = "KVCHAT_HOME"
# What an OSError says when a folder cannot be written in: read-only, not ours, full.
UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class HomeError(KvchatError):
    """A folder kvchat keeps its files in cannot be used, or holds something else where kvchat
    keeps a file of its own."""


def _home() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value).expanduser() if value else None


def data_dir() -> Path:
    """Assembled models live here."""
    home = _home()
    return home / "data" if home else Path(user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """Saved document states live here."""
    home = _home()
    return home / "cache" if home else Path(user_cache_dir(APP_NAME, appauthor=False))


def config_dir() -> Path:
    """The settings file (config.toml) lives here."""
    home = _home()
    return home / "config" if home else Path(user_config_dir(APP_NAME, appauthor=False))


def log_dir() -> Path:
    """llama.cpp's own log lines go to a file here."""
    home = _home()
    return home / "logs" if home else Path(user_log_dir(APP_NAME, appauthor=False))


def own_folders() -> tuple[Path, ...]:
    """Every folder kvchat keeps files in."""
    return data_dir(), cache_dir(), config_dir(), log_dir()


def is_unwritable(error: OSError) -> bool:
    """Whether `error` says a folder cannot be written in (read-only, not ours, full)."""
    return error.errno in UNWRITABLE


def unwritable(folder: Path, error: OSError, also: str = "") -> HomeError:
    """`error`, met writing in kvchat's `folder`, as one line that names the folder and where it
    comes from; `also`: one more way out, for the hint (`cache` off, where a command has it)."""
    reason = error.strerror or str(error)
    home = _home()
    if home is not None:
        where = f"it is under {HOME_ENV} ({home}): "
        moved = f"set {HOME_ENV} to a folder that is" if error.errno not in FULL else f"set {HOME_ENV} to a folder on another disk"
    else:
        where = f"kvchat keeps its files there ({HOME_ENV} is not set): "
        moved = f"set {HOME_ENV} to a folder kvchat may write in"
    fix = "free some space there (kvchat cache clear removes the saved readings)" if error.errno in FULL else "make it writable"
    return HomeError(f"cannot write in {folder} ({reason})", f"{where}{fix}, {moved}{f', or {also}' if also else ''}")


def foreign(path: Path, kind: str) -> HomeError:
    """Something that is not a plain file where kvchat keeps one of its own (`kind`: "a symbolic
    link", "a folder"): refused, never followed, opened or removed."""
    return HomeError(f"{path} is {kind}, not a file kvchat made", "remove it, and kvchat makes its own anew")


def checked_writable(folder: Path, also: str = "") -> Path:
    """`folder`, made where missing, once a file could be made in it (and removed): a command that
    saves what it reads says so at its start, not after reading. HomeError where it cannot."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".kvchat-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        if not is_unwritable(error):
            raise
        raise unwritable(folder, error, also) from None
    return folder


def as_home_error(error: OSError) -> HomeError | None:
    """`error` as a HomeError where it says that one of kvchat's folders cannot be written in (the
    front ends' last resort, for a write no check foresaw); None for any other."""
    if not is_unwritable(error) or not isinstance(error.filename, (str, bytes, os.PathLike)):
        return None
    path = Path(os.fsdecode(error.filename)).absolute()
    if not any(path == folder or folder in path.parents for folder in map(Path.absolute, own_folders())):
        return None
    return unwritable(path if path.is_dir() else path.parent, error)
