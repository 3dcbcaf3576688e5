"""Where kvchat keeps its files. `KVCHAT_HOME` overrides every path (tests, portable installs).

Something kvchat did not make where it keeps a file of its own is a HomeError: one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir, user_config_dir, user_data_dir, user_log_dir

from kvchat.errors import KvchatError

APP_NAME = "kvchat"


class HomeError(KvchatError):
    """A folder kvchat keeps its files in holds something else where kvchat keeps a file of its own."""


def _home() -> Path | None:
    value = os.environ.get("KVCHAT_HOME")
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


def foreign(path: Path, kind: str) -> HomeError:
    """Something that is not a plain file where kvchat keeps one of its own (`kind`: "a symbolic
    link", "a folder"): refused, never followed, opened or removed."""
    return HomeError(f"{path} is {kind}, not a file kvchat made", "remove it, and kvchat makes its own anew")
