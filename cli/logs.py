"""Logging for the front ends: everything (llama.cpp's C logs included) to a file, never the terminal."""

from __future__ import annotations

import logging
import os

from kvchat.errors import SettingsError, printable
from kvchat.paths import log_dir

LOG_FILE_NAME = "kvchat.log"
LEVEL_ENV = "KVCHAT_LOG_LEVEL"


def configure_logging() -> None:
    """Send kvchat's and llama.cpp's log lines to <log dir>/kvchat.log (KVCHAT_LOG_LEVEL sets the level)."""
    directory = log_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(directory / LOG_FILE_NAME, encoding="utf-8")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("kvchat")
    root.handlers[:] = [handler]
    root.setLevel(_level())
    root.propagate = False


def _level() -> str:
    """KVCHAT_LOG_LEVEL's level, INFO where it is unset or empty; SettingsError for one logging has not."""
    value = os.environ.get(LEVEL_ENV) or "INFO"
    if value.upper() not in logging.getLevelNamesMapping():
        raise SettingsError(f"unknown {LEVEL_ENV} {value!r}", f"use DEBUG, INFO, WARNING or ERROR, or unset {LEVEL_ENV}")
    return value.upper()


class PrintableFormatter(logging.Formatter):
    """Log lines without control characters (errors.printable), line by line (a traceback keeps its
    lines): they name documents, and `tail -f` shows the log on a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(printable(line) for line in super().format(record).split("\n"))
