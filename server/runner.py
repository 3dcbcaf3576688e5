"""`kvchat serve`'s uvicorn server: SIGINT and SIGTERM stop it promptly, cleanly, with exit 0.

uvicorn's graceful shutdown waits for every open response, and a streamed answer stays open
until the model ends it (minutes for a long one). So the service is stopped first: answers end
as "cancelled" with their final chunk and [DONE], a reading at its next chunk, waiting requests
and uploads being read get 503; then uvicorn waits for the responses, which end at once.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from kvchat.server.app import create_app
from kvchat.server.service import ChatService

GRACE_S = 5.0  # for the responses still open once the answers stopped: a client that does not read is cut off


class Server(uvicorn.Server):
    """uvicorn's server, stopping the scheduler when it shuts down. Unlike uvicorn's:
    - a second signal does not force the exit: uvicorn's forced exit cuts the streams without
      [DONE] and cancels the request handlers with tracebacks, and the shutdown is prompt anyway;
    - the signal is not raised again once the server stopped (uvicorn does, for the default
      action: SIGTERM then exits 143, SIGINT raises KeyboardInterrupt): a stopped server exits 0.
    """

    def __init__(
        self, config: uvicorn.Config, service: ChatService, stopping: asyncio.Event, on_started: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self.service = service
        self.stopping = stopping  # the app's: set, the uploads being read stop
        self.on_started = on_started

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.scheduler.stop()
        self.stopping.set()
        await super().shutdown(sockets)
        # the model thread's last events reach the loop before it closes
        await asyncio.to_thread(self.service.scheduler.join)


def server_for(
    service: ChatService, host: str, port: int, api_key: str | None = None, on_started: Callable[[], None] = lambda: None,
    allowed_origins: list[str] | None = None,
) -> Server:
    """The server of `service`'s app; `on_started` runs once it listens."""
    app = create_app(service, api_key, allowed_origins or [])
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACE_S)
    return Server(config, service, app.state.stopping, on_started)
