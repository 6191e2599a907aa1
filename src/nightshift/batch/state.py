"""What the server's routes share: its settings, the store, the queue, the key check.

``create_app`` hangs the one ``ServerState`` on the app (``app.state.nightshift``); the
route handlers are plain module-level functions that ask for it as a dependency
(``Shared``), so the routers only wire paths to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from nightshift.batch.execute import ServeSettings
from nightshift.batch.http import check_key, parse_json, public_base_url
from nightshift.batch.queue import BatchQueue
from nightshift.batch.records import content_lines
from nightshift.batch.store import BatchStore


@dataclass
class ServerState:
    settings: ServeSettings
    batches: BatchStore
    queue: BatchQueue
    # The start of the links handed out (Anthropic's results_url): worked out once, at
    # start, from the settings, never from a request (``http.public_base_url``).
    base_url: str = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        self.base_url = public_base_url(settings.host, settings.port, settings.public_url)

    @staticmethod
    async def json_body(request: Request) -> dict[str, Any]:
        """The request body as a JSON object, or a 400 that says what is wrong; its
        shape is checked before it is parsed, off the event loop (``http.parse_json``)."""
        raw = await request.body()
        return await run_in_threadpool(parse_json, raw)


async def server_state(request: Request) -> ServerState:
    """A route dependency: the app's one ``ServerState`` (async: no thread hop)."""
    return request.app.state.nightshift


Shared = Annotated[ServerState, Depends(server_state)]


def require_key(request: Request, state: Shared) -> None:
    """A router dependency: 401 unless the request carries the server's key."""
    check_key(request, state.settings.api_key)


def keyed_router(prefix: str, routes: tuple[tuple[str, str, Callable], ...]) -> APIRouter:
    """A router of ``(method, path, handler)`` routes, matched in that order, each behind
    the key check."""
    router = APIRouter(prefix=prefix, dependencies=[Depends(require_key)])
    for method, path, handler in routes:
        router.add_api_route(path, handler, methods=[method])
    return router


def count_lines(content: bytes) -> int:
    """Requests in a JSONL file: its non-blank lines, split as conversion splits them."""
    return sum(1 for _ in content_lines(content))
