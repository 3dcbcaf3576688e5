"""Run `kvchat serve`'s app on a free port in a thread, for tests over real sockets."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fake_engine import Emitted, Log
from kvchat.engine import Engine
from kvchat.server.runner import server_for
from kvchat.server.service import ChatService, NewScheduler, ServerLimits
from kvchat.serving.jobs import ChatJob
from kvchat.serving.scheduler import Scheduler


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serving(service: ChatService, api_key: str | None = None, allowed_origins: list[str] | None = None) -> Iterator[str]:
    """Yields the base URL of a live server of `service`; stops it (as `kvchat serve` does on a
    signal) and closes the service afterwards."""
    port = free_port()
    listening = threading.Event()
    server = server_for(service, "127.0.0.1", port, api_key, on_started=listening.set, allowed_origins=allowed_origins)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert listening.wait(30), "the test server did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        service.close()


@contextmanager
def running_server(
    model_path: Path, api_key: str | None = None, use_cache: bool = False, new_scheduler: NewScheduler = Scheduler,
    allowed_origins: list[str] | None = None, **limits: object,
) -> Iterator[tuple[str, ChatService]]:
    """Yields (base URL, service) of a live server on the model at `model_path`."""
    engine = Engine(str(model_path), use_cache=use_cache)
    service = ChatService(engine, ServerLimits(model_id="kvchat-test", **limits), new_scheduler=new_scheduler)  # type: ignore[arg-type]
    with serving(service, api_key, allowed_origins) as url:
        yield url, service


@dataclass(frozen=True)
class WatchedJob:
    job: ChatJob
    emitted: Emitted  # what the scheduler sent the job (passed on to the service too)


def watch_jobs(scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> Log[WatchedJob]:
    """Every job `scheduler` accepts from now on, with what it is sent: a test waits on these
    instead of polling /health."""
    jobs: Log[WatchedJob] = Log()
    submit = scheduler.submit

    def watched_submit(job: ChatJob) -> None:
        emitted, emit = Emitted(), job.emit

        def emit_and_record(item) -> None:
            emit(item)
            emitted(item)

        job.emit = emit_and_record
        submit(job)  # a refused job (QueueFull, ShuttingDown) is not watched
        jobs.append(WatchedJob(job, emitted))

    monkeypatch.setattr(scheduler, "submit", watched_submit)
    return jobs
