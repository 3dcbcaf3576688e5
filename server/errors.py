"""Errors as OpenAI sends them ({"error": {message, type, param, code}}), the API key check and
the request size limit."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvchat.engine import invalid_setting
from kvchat.errors import SETTING, InternalError, KvchatError, PromptTooLongError
from kvchat.server.schemas import OLD_FIELDS, SERVED_CHOICES, SETTING_FIELDS
from kvchat.serving.jobs import ShuttingDown

LOGGER = logging.getLogger(__name__)
# The settings a request sets, by their request fields; an error's hint naming another is left out.
REQUEST_FIELDS = {"max_tokens": "max_tokens", "temperature": "temperature", "seed": "seed",
                  **{name: field for field, name in SETTING_FIELDS.items()}}
SETTING_OF = {**SETTING_FIELDS, **{old: name for name, old in OLD_FIELDS.items()}}  # a request field's setting
PROMPT_TOO_LONG_HINT = (
    "send a shorter conversation, or long text as a document (POST /v1/documents) without kv_method: it is then read streamed"
)


class ApiError(HTTPException):
    """An OpenAI-shaped error response. An HTTPException, so that FastAPI passes it on unchanged
    when it is raised while the body is read (BodyLimit's 413) instead of answering 400."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 error_type: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.error_type, self.headers = error_type, headers or {}

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.code, self.param, self.error_type, self.headers)


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   error_type: str = "invalid_request_error", headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def api_error(error: KvchatError) -> ApiError:
    """The engine's error for an API client, its settings named by their request fields; a hint
    naming a setting a request cannot set is left out. A prompt too long whose hint names a
    setting (the engine's ways out are the CLI's) gets the API's own hint, which covers a pasted
    chat as well as a document; one that names none (a question too long) keeps its own."""
    if isinstance(error, ShuttingDown):
        return ApiError(503, error.message, "server_shutting_down", error_type="server_error")
    if isinstance(error, InternalError):
        return ApiError(500, error.one_line(REQUEST_FIELDS.get), "internal_error", error_type="server_error")
    if isinstance(error, PromptTooLongError) and SETTING.search(error.hint):
        error = PromptTooLongError(error.message, PROMPT_TOO_LONG_HINT)
    return ApiError(400, error.one_line(REQUEST_FIELDS.get), "invalid_request")


def install_error_handlers(app: FastAPI, hints: Mapping[str, str] | None = None) -> None:
    """Every refusal becomes OpenAI-shaped JSON (bugs too: see UnexpectedErrors); `hints`: this
    server's own for a wrong value of a setting, where its bound is not the setting's (ServerLimits.hints)."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON", "invalid_json")
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        if where in SETTING_OF:  # the message every front end gives for a wrong value of a setting
            name = SETTING_OF[where]
            error = invalid_setting(first, name, SERVED_CHOICES.get(name), (hints or {}).get(name))
            return error_response(400, error.one_line(REQUEST_FIELDS.get), "invalid_request", where)
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(first.get("msg", "invalid request"))
        return error_response(400, message, "invalid_request", where or first.get("ctx", {}).get("param"))

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, error: HTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), None, None, "invalid_request_error", error.headers)

    @app.exception_handler(KvchatError)
    async def _kvchat(_request: Request, error: KvchatError) -> JSONResponse:
        return api_error(error).response()


class UnexpectedErrors:
    """A bug becomes a 500 with OpenAI's shape and one traceback in kvchat's log file. Starlette's
    own handler for Exception answers too, but then raises the error on to uvicorn, which prints
    it on the terminal."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            LOGGER.exception("unexpected error")
            if scope["type"] == "http" and not started:  # else the response is cut short: nothing better to send
                response = error_response(500, "internal server error (details in the server's log file)", None, None, "server_error")
                await response(scope, receive, send)


class ApiKeyCheck:
    """With a key, every /v1 request must send `Authorization: Bearer KEY`. Checked before anything
    reads the body: a request without the key gets 401 whatever its body (bad JSON, 60 MB)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.api_key is not None and _is_api(scope["path"]) and not _authorized(scope, self.api_key):
            response = ApiError(401, "Incorrect or missing API key: send Authorization: Bearer <key>", "invalid_api_key").response()
            return await response(scope, receive, send)
        await self.app(scope, receive, send)


def _is_api(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def _authorized(scope: Scope, api_key: str) -> bool:
    header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode("latin-1"), api_key.encode())


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413, whether or not Content-Length is sent."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> ApiError:
        return ApiError(413, f"request body over {self.max_bytes:,} bytes", "request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large().response()(scope, receive, send)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # a chunked body: whoever reads it gets the 413
                raise self._too_large()
            return message

        await self.app(scope, limited, send)
