"""The headers every response carries, set in one place: the content security policy, no MIME
sniffing, no framing.

The chat page loads only its own scripts and styles and talks only to its own origin; document
text and answers are put in as text, and the policy forbids inline scripts should that ever slip.
The API docs (/docs, /redoc) are FastAPI's pages, whose one inline script starts Swagger UI or
ReDoc: their policy allows inline scripts, and like the page's loads nothing from another origin
(their scripts and styles are served from the fastapi-offline package, so they work offline).
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
DOCS_ASSETS = "/static-offline-docs"  # where the docs' scripts and styles are served from
_COMMON = "img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
PAGE_POLICY = f"default-src 'self'; style-src 'self' 'unsafe-inline'; {_COMMON}"
DOCS_POLICY = f"default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; worker-src 'self' blob:; {_COMMON}"


class SecurityHeaders:
    """Adds the policy for the response's path, nosniff and frame denial to every HTTP response:
    the page, its files, the API's answers and errors alike (no route sets its own)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        policy = DOCS_POLICY if scope["path"] in DOCS_PATHS else PAGE_POLICY

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = policy
                headers["X-Content-Type-Options"] = "nosniff"
                headers["X-Frame-Options"] = "DENY"
            await send(message)

        await self.app(scope, receive, with_headers)
