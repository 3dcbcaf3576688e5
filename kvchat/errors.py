"""One error hierarchy for kvchat. Every error carries a one-line message and a hint.

Front ends translate these in exactly one place each (CLI: exit code 2 and one line on stderr).
"""

from __future__ import annotations

import threading


class KvchatError(Exception):
    """Base class: `message` says what went wrong, `hint` what the user can do about it."""

    exit_code = 2

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """Message and hint on one line: a library's error text quoted in either may hold newlines."""
        message, hint = " ".join(self.message.split()), " ".join(self.hint.split())
        return f"{message} (hint: {hint})" if hint else message


class DocumentError(KvchatError):
    """The document cannot be read: missing, empty, encrypted, scanned, corrupt or binary."""


class ModelError(KvchatError):
    """The model is missing, damaged or cannot be loaded."""


class SettingsError(KvchatError):
    """A setting is out of range or inconsistent with another one."""


class PromptTooLongError(KvchatError):
    """The prompt (document + question) plus the answer does not fit the model or the context."""


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
