"""A request as the scheduler takes it (a job), and what refuses one: a full waiting line, or a
scheduler stopping."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvchat.errors import KvchatError
from kvchat.events import Event
from kvchat.serving.requests import ChatRequest


class QueueFull(Exception):
    """Every sequence is answering and the waiting line is full; try again shortly."""


class ShuttingDown(KvchatError):
    """The scheduler stopped before this job was answered (it was waiting, or being read)."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down", "try again once it is back")


@dataclass
class ChatJob:
    """One request. `emit` receives Events, then a Done or a KvchatError (from the model thread)."""

    request: ChatRequest
    emit: Callable[[Event | KvchatError], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
