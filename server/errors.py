"""Errors as OpenAI sends them ({"error": {message, type, param, code}}), the API key check and
the request size limit."""

from __future__ import annotations

import json
import logging
import secrets

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvchat.errors import KvchatError

LOGGER = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 error_type: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.error_type, self.headers = error_type, headers or {}

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.code, self.param, self.error_type, self.headers)


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   error_type: str = "invalid_request_error", headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every failure becomes OpenAI-shaped JSON; nothing leaks a stack trace."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON", "invalid_json")
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(first.get("msg", "invalid request"))
        return error_response(400, message, "invalid_request", where or None)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, error: HTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), None, None, "invalid_request_error", error.headers)

    @app.exception_handler(KvchatError)
    async def _kvchat(_request: Request, error: KvchatError) -> JSONResponse:
        return error_response(400, error.one_line(), "invalid_request")

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, error: Exception) -> JSONResponse:
        LOGGER.exception("unexpected error")
        return error_response(500, "internal server error (details in the server's log file)", None, None, "server_error")


def check_api_key(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "Incorrect or missing API key: send Authorization: Bearer <key>", "invalid_api_key")


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413, whether or not Content-Length is sent."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise ApiError(413, f"request body over {self.max_bytes:,} bytes", "request_too_large")
            return message

        await self.app(scope, limited, send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"error": {"message": f"request body over {self.max_bytes:,} bytes", "type": "invalid_request_error",
                                     "param": None, "code": "request_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
