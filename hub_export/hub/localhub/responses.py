"""The local Hub's error responses as huggingface_hub reads them, the request body limits, and the request log."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hub_export.errors import HubExportError
from hub_export.hub.localhub.records import HubAPIError
from hub_export.redact import redact_query

logger = logging.getLogger("hub_export.hub.localhub")
_HEADER_LIMIT = 1000  # characters of an error message echoed in X-Error-Message


def header_safe(text: str) -> str:
    """Printable ASCII only, bounded: user input copied into a header must not end it (CR, LF) or break it (NUL)."""
    text = "".join(c if " " <= c <= "~" else "?" for c in " ".join(text.split()))
    return text[:_HEADER_LIMIT]


def error_response(status: int, message: str, code: str | None = None, **extra: Any) -> JSONResponse:
    """The Hub's error shape: ``{"error": msg}`` plus ``X-Error-Message`` (and ``X-Error-Code``)."""
    headers = {"X-Error-Message": header_safe(message)}
    if code:
        headers["X-Error-Code"] = header_safe(code)
    message = message.encode("utf-8", "replace").decode()  # a lone surrogate from the client cannot be encoded
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def on_hub_error(_: Request, exc: HubAPIError) -> JSONResponse:
    response = error_response(exc.status, exc.message, exc.code)
    response.headers.update({name: header_safe(value) for name, value in exc.headers.items()})
    return response


def on_input_error(_: Request, exc: HubExportError) -> JSONResponse:
    return error_response(400, str(exc))


def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail))


def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(400, f"Invalid request: {exc.errors()}")


def on_unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    """A bug still answers in the Hub's shape (the traceback goes to the server log)."""
    return error_response(500, f"Internal error of the local hub: {type(exc).__name__}")


def too_large(limit: int, hint: str = " (hub serve --max-body-mb)") -> HubAPIError:
    return HubAPIError(413, f"Request body larger than {limit} bytes, the most this hub accepts here{hint}")


class BodyLimit:
    """Bound request bodies: 413 from Content-Length before reading, else once the stream passes the limit.

    LFS object uploads stream to disk and get their own, larger limit.
    """

    def __init__(self, app: ASGIApp, max_body: int, max_lfs: int):
        self.app = app
        self.max_body = max_body
        self.max_lfs = max_lfs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_lfs if scope["path"].startswith("/api/lfs-upload/") else self.max_body
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:  # h11 has already refused malformed lengths
            error = too_large(limit)
            await error_response(error.status, error.message)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise too_large(limit)  # raised inside the handler's read: answered by on_hub_error
            return message

        await self.app(scope, counted, send)


class RequestLog:
    """One log line per request: method, path (secrets redacted), status, milliseconds."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            query = scope.get("query_string", b"").decode("latin-1")
            path = scope["path"] + (f"?{redact_query(query)}" if query else "")
            elapsed = (time.perf_counter() - start) * 1000
            logger.info("%s %s %d %.1fms", scope["method"], path, status, elapsed)
