"""Run `kvchat serve`'s app on a free port in a thread, for tests over real sockets."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvchat.engine import Engine
from kvchat.server.runner import server_for
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
    listening = threading.Event()
    server = server_for(service, "127.0.0.1", port, api_key, on_started=listening.set)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert listening.wait(30), "the test server did not start"
        yield f"http://127.0.0.1:{port}", service
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        service.close()
