"""What both APIs share: errors in each provider's shape, API keys, the upload limit.

Every error a client gets is JSON in the shape its SDK parses (OpenAI's ``{"error":
{message, type, param, code}}``, Anthropic's ``{"type": "error", "error": {type,
message}}``), chosen by the path; nothing unexpected reaches a client as a traceback.
Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("nightshift.batch.server")

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    500: "api_error",
}
_OPENAI_TYPES = {401: "invalid_request_error", 404: "invalid_request_error", 500: "server_error"}


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(path: str, status: int, message: str, param=None, code=None) -> JSONResponse:
    if is_anthropic(path):
        kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        kind = _OPENAI_TYPES.get(status, "invalid_request_error")
        body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request.url.path, exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
        message = f"{where or 'request'}: {first.get('msg', 'invalid request')}"
        return error_response(request.url.path, 400, message, where or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(request.url.path, exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s: %r", request.method, request.url.path, exc)
        return error_response(request.url.path, 500, "internal server error")


def check_key(request: Request, expected: str | None) -> None:
    """OpenAI sends ``Authorization: Bearer KEY``, Anthropic ``x-api-key: KEY``."""
    if expected is None:
        return
    if is_anthropic(request.url.path):
        given = request.headers.get("x-api-key") or _bearer(request)
    else:
        given = _bearer(request)
    if not given or not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, "invalid API key", code="invalid_api_key")


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413, told by its
    Content-Length before anything is read, or cut off once the bytes streamed pass it."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._too_large(path, scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._too_large(path, scope, receive, send)

    async def _too_large(self, path, scope, receive, send):
        message = f"the request is over the server's limit of {self.max_bytes} bytes"
        await error_response(path, 413, message, code="file_too_large")(scope, receive, send)


class _TooLarge(Exception):
    pass
