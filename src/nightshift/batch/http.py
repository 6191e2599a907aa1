"""What both APIs share: errors in each provider's shape, API keys, body limits, JSON
bodies, the public URL.

Every error a client gets is JSON in the shape its SDK parses (OpenAI's ``{"error":
{message, type, param, code}}``, Anthropic's ``{"type": "error", "error": {type,
message}}``), chosen by the path; nothing unexpected reaches a client as a traceback.
Keys are compared in constant time and never logged.

A JSON body costs far more in Python objects than in bytes (an empty list is 3 bytes
and about 70 in memory), so its size is bounded per route and its shape (depth, and
the memory its objects would take) is checked on the raw bytes before ``json.loads``
builds anything.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import socket
import threading
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nightshift.batch.jsonshape import MAX_DEPTH, nesting_depth, skeleton
from nightshift.errors import UserError

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


SMALL_BODY_BYTES = 1 << 20  # every body but an upload or an Anthropic create is tiny
LARGE_BODIES = frozenset({("POST", "/v1/files"), ("POST", "/v1/messages/batches")})


class BodyLimit:
    """ASGI middleware: a request body over its route's limit (``max_bytes`` for an
    upload or an Anthropic create, which carries its requests, ``SMALL_BODY_BYTES``
    otherwise) gets 413, told by its Content-Length before anything is read, or cut
    off once the bytes streamed pass it."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        large = (scope.get("method"), path.rstrip("/")) in LARGE_BODIES
        limit = self.max_bytes if large else min(self.max_bytes, SMALL_BODY_BYTES)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await _too_large(limit, path, scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await _too_large(limit, path, scope, receive, send)


async def _too_large(limit: int, path: str, scope, receive, send) -> None:
    message = f"the request is over the server's limit of {limit} bytes for it"
    await error_response(path, 413, message, code="file_too_large")(scope, receive, send)


class _TooLarge(Exception):
    pass


MAX_JSON_DEPTH = MAX_DEPTH
JSON_OBJECTS_BYTES = 256 << 20  # the memory a body's parsed objects may take, at most
_CONTAINER_BYTES, _ITEM_BYTES = 72, 56  # an empty list or dict; a value and its slot
_PARSING = threading.BoundedSemaphore(2)  # large bodies parsed at once, at most


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or ``ApiError`` 400 saying what is wrong: checked
    before it is parsed (``check_json_shape``), parsed in this (worker) thread."""
    check_json_shape(raw)
    with _PARSING if len(raw) > SMALL_BODY_BYTES else contextlib.nullcontext():
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}"[:300]) from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def check_json_shape(raw: bytes) -> None:
    """400 for a body nested deeper than ``MAX_JSON_DEPTH`` or whose objects would take
    more than ``JSON_OBJECTS_BYTES``, told from the bytes: with the strings' contents
    blanked out, brackets, commas and colons are the structure itself. (Invalid JSON
    may be counted wrong here; ``json.loads`` refuses it next.) Only UTF-8 is read
    this way: in UTF-16, a character's byte may look like a quote and hide structure."""
    if json.detect_encoding(raw) not in ("utf-8", "utf-8-sig"):
        raise ApiError(400, "the request body must be JSON in UTF-8")
    shape = skeleton(raw)
    containers = shape.count(b"[") + shape.count(b"{")
    items = shape.count(b",") + shape.count(b":")
    if containers * _CONTAINER_BYTES + items * _ITEM_BYTES > JSON_OBJECTS_BYTES:
        raise ApiError(
            400,
            f"the request body has too many JSON values ({containers} arrays and objects, "
            f"about {items} values): split the batch",
        )
    if nesting_depth(shape) > MAX_JSON_DEPTH:
        raise ApiError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels")


def public_base_url(host: str, port: int, public_url: str | None) -> str:
    """The URL clients reach the server at, for the links it hands out (Anthropic's
    ``results_url``, which the SDK fetches with the key): the configured one, else the
    bind address; never a request's Host header, which a client can forge."""
    if public_url:
        return public_url
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()  # a wildcard bind: this machine's name
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return f"http://{host}:{port}"


def check_public_url(url: str) -> str:
    """``--public-url`` as links start with it: http(s)://host[:port][/path], no query."""
    parts = urlsplit(url.strip())
    try:
        parts.port  # noqa: B018 (a bad port raises)
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise UserError(
            f"--public-url {url!r}: give the URL clients reach the server at, "
            "such as https://batches.example.com (no query)"
        )
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
