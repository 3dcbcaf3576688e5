"""The FastAPI app: OpenAI's chat completions and models endpoints, kvchat's documents, health.

`create_app(service, api_key)` builds it around an injected ChatService; nothing lives in module
globals, so tests run several servers side by side. Its `state.stopping` is set by the server as
it stops: the uploads being read stop and answer 503 at once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, File, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.types import Receive, Scope, Send

from kvchat.events import Done, Event, Notice, Progress, Pruned, Token
from kvchat.server.errors import ApiError, ApiKeyCheck, BodyLimit, UnexpectedErrors, install_error_handlers
from kvchat.server.schemas import ChatCompletionRequest
from kvchat.server.security import DOCS_ASSETS, SecurityHeaders
from kvchat.server.service import ChatService

# An answer stopped by its client or by the server's shutdown ("cancelled") ends as OpenAI's "stop".
FINISH_REASONS = {"stop": "stop", "max_tokens": "length", "cancelled": "stop"}
T = TypeVar("T")
# How long a stopped upload's handler waits for its reading to stop (OCR: within a tenth of a second;
# other extraction does not look at the cancel event and is left to end in its thread).
STOP_WAIT_S = 2.0
STATIC = Path(__file__).parent / "static"  # the chat page: plain HTML, CSS and JS, no build step


def create_app(service: ChatService, api_key: str | None = None, allowed_origins: list[str] | None = None) -> FastAPI:
    """`allowed_origins`: web origins whose pages may call the API (CORS); the page itself needs none."""
    app = FastAPIOffline(title="kvchat", version="1", description="Chat with documents; a KV cache that stays small.",
                         static_url=DOCS_ASSETS, swagger_ui_parameters={"validatorUrl": None})  # no call to an online validator
    app.add_middleware(BodyLimit, max_bytes=service.limits.max_body_bytes)
    app.add_middleware(ApiKeyCheck, api_key=api_key)  # outside BodyLimit: no key, no body read
    if allowed_origins:  # outside the key check: a browser's preflight carries no key
        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(UnexpectedErrors)
    app.add_middleware(SecurityHeaders)  # outermost: every response, errors and refusals too
    install_error_handlers(app, service.limits.hints)
    app.state.stopping = stopping = asyncio.Event()

    model_id = service.limits.model_id
    settings = {"object": "list", "data": service.limits.request_settings()}

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", "model": model_id, **service.scheduler.load}

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [_model_card(model_id)]}

    @app.get("/v1/models/{model}")
    async def model(model: str) -> dict[str, object]:
        if model != model_id:
            raise ApiError(404, f"The model {model!r} does not exist", "model_not_found", "model")
        return _model_card(model_id)

    @app.get("/v1/settings")
    async def request_settings() -> dict[str, object]:
        """kvchat's: the settings a request may set, with this server's bounds, choices and defaults (the page's form)."""
        return settings

    @app.post("/v1/documents")
    async def upload(request: Request, file: UploadFile = File(...)) -> dict[str, object]:
        data = await file.read()
        stored = await _stoppable(
            request, stopping, lambda cancel: service.documents.add(file.filename, data, service.document_tokens, cancel)
        )
        await run_in_threadpool(service.read_later, stored)  # it tokenizes the document's prompt: not on the event loop
        return stored.describe()

    @app.get("/v1/documents")
    async def documents() -> dict[str, object]:
        return {"object": "list", "data": [stored.describe() for stored in service.documents.all()]}

    @app.delete("/v1/documents/{document_id}")
    async def delete(document_id: str) -> dict[str, object]:
        if not service.documents.delete(document_id):
            raise ApiError(404, f"no document {document_id!r}", "document_not_found", "document_id")
        return {"id": document_id, "object": "document", "deleted": True}

    @app.get("/v1/documents/{document_ids}/text")
    async def document_text(document_ids: str) -> dict[str, object]:
        """kvchat's: the text that sources' and kept ranges' offsets point into (ids joined by commas)."""
        return service.document_text(document_ids.split(","))

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> object:
        if body.model != model_id:
            raise ApiError(404, f"The model {body.model!r} does not exist; this server has {model_id!r}", "model_not_found", "model")
        answer = await service.start(body)  # refusals are HTTP errors before any byte is sent
        completion_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        report = _ReadingReport()  # for the kv block
        if body.stream:  # the headers go at once, then the reading's progress, then the answer
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunks = _sse(answer.events(), completion_id, created, model_id, include_usage, report)
            return _AnswerStream(chunks, answer.stop)
        try:
            done = await _unless_client_leaves(request, _last_event(answer.events(), report))
        finally:
            answer.stop()  # also if the events were never read: the client left at once
        return JSONResponse(_completion(done, completion_id, created, model_id, report))

    return app


async def _unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work` (which reads an answer's events), cancelled when the client closes the connection
    first: cancelling it closes the events, which cancels the job, which stops its reading or its
    answer. For an answer sent whole: Starlette notices a disconnect only while it streams a
    response, and nothing is sent before the answer is done (a reading can take minutes)."""
    answer, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((answer, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not answer.done():
            answer.cancel()
            await asyncio.wait((answer,))  # its job is cancelled once this returns
    if answer.cancelled():
        raise ApiError(499, "the client closed the connection", "client_closed")  # sent to nobody
    return answer.result()


async def _stoppable(request: Request, stopping: asyncio.Event, work: Callable[[threading.Event], T]) -> T:
    """`work(cancel)` in a worker thread (an upload's OCR can take minutes), stopped when the client
    closes the connection or the server stops (`stopping` set): either sets `cancel`, and the
    handler waits for the work to stop (OCR does between pages, removing its temporary files)
    before it answers 499 or 503. Should uvicorn cancel the handler (its grace over), it answers
    503 too rather than raising CancelledError on to uvicorn, which prints it as "Exception in
    ASGI application"."""
    cancel = threading.Event()
    result = asyncio.ensure_future(run_in_threadpool(work, cancel))
    gone, stopped = asyncio.ensure_future(_disconnected(request)), asyncio.ensure_future(stopping.wait())
    client_left = False
    try:
        await asyncio.wait((result, gone, stopped), return_when=asyncio.FIRST_COMPLETED)
        client_left = gone.done()
    except asyncio.CancelledError:
        pass
    finally:
        gone.cancel()
        stopped.cancel()
    if not result.done():
        await _stop_work(result, cancel)
        if client_left:
            raise ApiError(499, "the client closed the connection", "client_closed")  # sent to nobody
        raise ApiError(503, "the server is shutting down", "server_shutting_down", error_type="server_error")
    return result.result()


async def _stop_work(result: asyncio.Future[T], cancel: threading.Event) -> None:
    """Set `cancel` and wait, at most STOP_WAIT_S, until the thread behind `result` returned (its
    error is dropped). Cancelled meanwhile, it waits on: at shutdown uvicorn cancels the handler,
    then asyncio.run cancels it again as the loop closes, and waits for it; the work (OCR) stops
    within POLL_S of a page anyway, and its temporary files go as it stops."""
    cancel.set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_WAIT_S
    while not result.done() and loop.time() < deadline:
        try:
            await asyncio.wait((result,), timeout=deadline - loop.time())
        except asyncio.CancelledError:
            continue
    if result.done() and not result.cancelled():
        result.exception()  # retrieved: asyncio does not log it as never retrieved


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone (the body was read already: nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@dataclass
class _ReadingReport:
    """What the events before an answer said of its prompt's reading, for the kv block."""

    notices: list[str] = field(default_factory=list)
    kept_by_document: dict[str, int] = field(default_factory=dict)
    kept_spans: list[tuple[int, int]] = field(default_factory=list)

    def note(self, event: Event) -> None:
        if isinstance(event, Notice):
            self.notices.append(event.text)
        elif isinstance(event, Pruned):
            self.kept_by_document = dict(event.kept_by_document)
            self.kept_spans = list(event.kept_spans)


async def _last_event(events: AsyncIterator[Event], report: _ReadingReport) -> Done:
    """The answer's Done, the last of its events (those before it noted in `report`)."""
    last: Event | None = None
    async for last in events:
        report.note(last)
    if not isinstance(last, Done):
        raise _no_result()
    return last


def _no_result() -> ApiError:
    return ApiError(500, "the answer ended without a result", None, None, "server_error")


def _model_card(model_id: str) -> dict[str, object]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "kvchat"}


def _usage(done: Done) -> dict[str, int]:
    stats = done.stats
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens}


def _kv(done: Done, report: _ReadingReport) -> dict[str, object]:
    """kvchat's extension of a completion: how the prompt was read and kept."""
    stats = done.stats
    return {"method": stats.method, "read": stats.read, "prompt_tokens": stats.prompt_tokens, "loaded_tokens": stats.loaded_tokens,
            "read_tokens": stats.read_tokens, "kept_tokens": stats.kept_tokens, "ttft_s": round(stats.ttft_s, 4),
            "kv_bytes_full": stats.kv_bytes_full, "kv_bytes_kept": stats.kv_bytes_kept,
            "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2),
            "notices": report.notices, "kept_by_document": report.kept_by_document, "kept_spans": report.kept_spans,
            "sources": [asdict(source) for source in done.sources], "attention": list(done.attention)}


def _completion(done: Done, completion_id: str, created: int, model_id: str, report: _ReadingReport) -> dict[str, object]:
    return {
        "id": completion_id, "object": "chat.completion", "created": created, "model": model_id,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": done.answer},
                     "finish_reason": FINISH_REASONS.get(done.stats.stop_reason, "stop")}],
        "usage": _usage(done),
        "kv": _kv(done, report),
    }


class _AnswerStream(StreamingResponse):
    """A streamed answer whose job is stopped however the response ends: the answer done, its
    client gone (even before the first chunk), or the server stopping."""

    def __init__(self, chunks: AsyncIterator[str], stop: Callable[[], None]) -> None:
        super().__init__(chunks, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._stop = stop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stop()


async def _sse(events: AsyncIterator[Event], completion_id: str, created: int, model_id: str,
               include_usage: bool, report: _ReadingReport) -> AsyncIterator[str]:
    """OpenAI's chunks: the role at once; while the prompt is read, a comment line for each chunk
    read (`: progress {"done": 512, "total": 4096}`: clients skip comments, a page can show it);
    the content pieces; the finish reason (with kvchat's kv block); usage if asked; [DONE]. An
    error of the reading, met once the headers went, is a chunk with an OpenAI-shaped error."""

    def chunk(delta: dict[str, str], finish_reason: str | None = None, **extra: object) -> str:
        body = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model_id,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    try:
        yield chunk({"role": "assistant", "content": ""})
        async for event in events:
            report.note(event)
            if isinstance(event, Progress):
                yield f": progress {json.dumps({'done': event.done, 'total': event.total})}\n\n"
            elif isinstance(event, Token):
                yield chunk({"content": event.text})
            elif isinstance(event, Done):
                yield chunk({}, FINISH_REASONS.get(event.stats.stop_reason, "stop"), kv=_kv(event, report))
                if include_usage:
                    body = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                            "model": model_id, "choices": [], "usage": _usage(event)}
                    yield f"data: {json.dumps(body)}\n\n"
                break
        else:
            raise _no_result()
        yield "data: [DONE]\n\n"
    except ApiError as error:
        yield f"data: {json.dumps({'error': {'message': error.message, 'type': error.error_type, 'code': error.code}})}\n\n"
    finally:
        await events.aclose()  # a client that went away: stop the answer, free its sequence
