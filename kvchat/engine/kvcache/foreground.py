"""A question goes before a background reading: while any kvchat process reads for and answers a
question (`kvchat ask`), the whole readings in the background pause between two batches, so that
they do not take the cores the question's own reading needs, and go on when it is answered.

The questions hold `foreground.lock` shared (flock); a background reading asks for it exclusively
and gets it only while no question holds it. The kernel drops a lock when its process ends, so a
question that dies never holds a reading up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

PAUSED_CHECK_S = 0.25  # how often a paused reading looks whether the questions are answered, or it was stopped


class Foreground:
    """The questions answered now, in every kvchat process that shares the folder `root`."""

    def __init__(self, root: Path) -> None:
        self.path = root / "foreground.lock"

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Held while this process reads for a question and answers it."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def give_way(self, cancel: threading.Event, on_pause: Callable[[], None] = lambda: None) -> bool:
        """Wait while a question is answered (or until `cancel`), calling `on_pause` once when the
        wait begins; whether this waited."""
        fd = self._open()
        waited = False
        try:
            while not cancel.is_set():
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return waited
                except BlockingIOError:
                    if not waited:
                        on_pause()
                    waited = True
                    cancel.wait(PAUSED_CHECK_S)
            return waited
        finally:
            os.close(fd)
