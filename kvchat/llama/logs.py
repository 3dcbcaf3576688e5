"""Route llama.cpp's and ggml's C log lines into Python `logging` (logger "kvchat.llama").

Nothing from C may reach the terminal: the TUI draws on it and stdout carries the answer.
The ctypes callback object is module-level so it stays alive for as long as C may call it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from kvchat.llama._lib import raw

LOGGER = logging.getLogger("kvchat.llama")

# ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_state = {"level": logging.DEBUG, "line": ""}
_captures: list[list[str]] = []


def _on_log(level: int, text: bytes | None, _user_data: object) -> None:
    message = (text or b"").decode("utf-8", errors="replace")
    if level != 5:
        _state["level"] = _LEVELS.get(level, logging.INFO)
    _state["line"] += message
    if _state["line"].endswith("\n"):
        line = _state["line"].rstrip("\n")
        LOGGER.log(_state["level"], line)
        for capture in _captures:
            capture.append(line)
        _state["line"] = ""


_CALLBACK = raw.llama_log_callback(_on_log)


def route_logs() -> None:
    """Install the callback (idempotent). Call before loading a model."""
    raw.llama_log_set(_CALLBACK, None)


@contextmanager
def captured_lines() -> Iterator[list[str]]:
    """The lines llama.cpp logs while the block runs (they still go to the log file too)."""
    lines: list[str] = []
    _captures.append(lines)
    try:
        yield lines
    finally:
        _captures.remove(lines)
