"""Run `kvchat serve`'s app on a free port in a thread, for tests over real sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from kvchat.engine import Engine
from kvchat.server.app import create_app
from kvchat.server.service import ChatService, ServerLimits


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(
    model_path: Path, api_key: str | None = None, use_cache: bool = False, **limits: object
) -> Iterator[tuple[str, ChatService]]:
    """Yields (base URL, service) of a live server; stops it and frees the model afterwards."""
    service = ChatService(Engine(str(model_path), use_cache=use_cache), ServerLimits(model_id="kvchat-test", **limits))  # type: ignore[arg-type]
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service, api_key), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", service
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        service.close()
