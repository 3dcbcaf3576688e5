"""One error hierarchy for kvchat. Every error carries a one-line message and a hint.

Front ends translate these in exactly one place each (CLI: one line on stderr, and exit code 2 for
a usage error (a setting), 1 for a failure at run time (a document, a model, llama.cpp), 130 when
stopped).
Below the front ends a message or hint names a setting in backquotes, by its name in the
settings (`n_ctx`, `budget`, `heads`), never by one front end's flag: each front end says how it
calls a setting (the CLI `--n-ctx`, the server its request field) once, in one_line()'s `named`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

SETTING = re.compile(r"`([a-z_]+)`")  # a setting named in a message or hint
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0 (ESC among them), DEL and C1 control characters
CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # the same but for tab and newline
PICTURES = 0x2400  # Unicode's control pictures: U+2400 + a C0 code (␛ for ESC, ␇ for BEL, ␍ for CR)
DEL_PICTURE = "\u2421"  # ␡
NO_PICTURE = "\ufffd"  # a C1 character has no picture of its own: �


def printable(text: str, lines: bool = False) -> str:
    """`text` as kvchat shows it (a file's name, a path, a message or a log line naming one; with
    `lines`, text laid out in lines: an answer, a document), each control character shown as a
    visible stand-in of one character (␛, ␇, ␍, ␡; � for a C1 code): a name or an answer holding
    ESC would write `ESC[31m` (colours) or `ESC]0;…` (the window's title) to the terminal, and
    other codes ring, move the cursor or erase. `lines` keeps newlines and tabs. One character
    stands for one, so offsets into the text (the chat's kept spans in a document) still point at
    the same characters. Every front end shows names, answers and documents through this, errors
    through one_line(); what it hands to programs (`--json`, the server's API) keeps the text,
    escaped as JSON escapes it."""
    return (CONTROL_BUT_LINES if lines else CONTROL).sub(_picture, text)


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    return chr(PICTURES + code) if code < 0x20 else DEL_PICTURE if code == 0x7F else NO_PICTURE


def plain(name: str) -> str | None:
    """A setting as the engine names it."""
    return name


class KvchatError(Exception):
    """Base class: `message` says what went wrong, `hint` what the user can do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self, named: Callable[[str], str | None] = plain) -> str:
        """Message and hint on one line (a library's error text quoted in either may hold
        newlines), each setting in them as `named(setting)` calls it; a hint naming a setting the
        front end has not (`named` returns None) is left out."""
        message = _with_settings(printable(" ".join(self.message.split())), named, fallback=True)
        hint = _with_settings(printable(" ".join(self.hint.split())), named, fallback=False)
        return f"{message} (hint: {hint})" if hint else message


def _with_settings(text: str, named: Callable[[str], str | None], fallback: bool) -> str | None:
    """`text` with each `setting` as `named` calls it; where `named` has none: the setting's own
    name if `fallback`, else None for the whole text."""
    missing = False

    def name(match: re.Match[str]) -> str:
        nonlocal missing
        called = named(match.group(1))
        missing = missing or called is None
        return called if called is not None else match.group(1)

    text = SETTING.sub(name, text)
    return None if missing and not fallback else text


class DocumentError(KvchatError):
    """The document cannot be read: missing, empty, encrypted, scanned, corrupt or binary."""


class ModelError(KvchatError):
    """The model is missing, damaged or cannot be loaded."""


class SettingsError(KvchatError):
    """A setting is out of range or inconsistent with another one: a usage error."""

    exit_code = 2


class PromptTooLongError(KvchatError):
    """The prompt (document + question) plus the answer does not fit the model or the context (the
    settings asked for: a usage error)."""

    exit_code = 2


class DecodeError(KvchatError):
    """llama.cpp refused a batch (no room in the KV cache, aborted, invalid batch, internal error)."""

    def __init__(self, message: str, hint: str = "", code: int = 0) -> None:
        super().__init__(message, hint)
        self.code = code


class KvCacheFullError(DecodeError):
    """No free KV cell was left for the batch (llama_decode returned 1)."""


class InternalError(KvchatError):
    """A bug, or llama.cpp failing where it should not: nothing the request or the user changes
    fixes it (the server answers 500, not 400)."""


class CancelledError(KvchatError):
    """The user stopped the work (Ctrl-C, Esc, a closed connection)."""

    exit_code = 130


def raise_if_cancelled(cancel: threading.Event | None) -> None:
    """Stop long work between steps once `cancel` is set (work checks it at each chunk or token)."""
    if cancel is not None and cancel.is_set():
        raise CancelledError("stopped", "")
