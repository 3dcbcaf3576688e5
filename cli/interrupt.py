"""Ctrl-C as a cancel event.

A KeyboardInterrupt raised inside one of llama.cpp's callbacks (the attention probe, the log
router) would be swallowed by ctypes, so Ctrl-C only sets an event that the engine checks
between batches and tokens. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def interrupt_as_cancel() -> Iterator[threading.Event]:
    cancel = threading.Event()

    def on_interrupt(_signum: int, _frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)
