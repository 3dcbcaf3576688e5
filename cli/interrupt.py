"""Ctrl-C as a cancel event.

A KeyboardInterrupt raised inside one of llama.cpp's callbacks (the attention probe, the log
router) would be swallowed by ctypes, so Ctrl-C only sets an event that the engine checks
between tokens and batches (llama.cpp between the nodes of a reading's batch, which then stops
part-way). A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def interrupt_as_cancel(terminate: bool = False) -> Iterator[threading.Event]:
    """`terminate`: SIGTERM sets the event too (a background reading that `kvchat cache stop` ends)."""
    cancel = threading.Event()

    def on_interrupt(_signum: int, _frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    signals = (signal.SIGINT, signal.SIGTERM) if terminate else (signal.SIGINT,)
    previous = {signum: signal.signal(signum, on_interrupt) for signum in signals}
    try:
        yield cancel
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def signals_stop_reading() -> Iterator[threading.Event]:
    """SIGINT and SIGTERM stop the reading of documents (OCR can take minutes): each sets the
    yielded event, which OCR checks between pages and while tesseract reads one, and raises
    KeyboardInterrupt, which stops any other extraction and runs its `finally` blocks, so that
    temporary files go (SIGTERM's default action would end the process without them). main()
    turns it into "kvchat: stopped" and exit 130. Not used around the engine, whose llama.cpp
    callbacks would swallow the exception (interrupt_as_cancel is)."""
    cancel = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        cancel.set()
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield cancel
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
