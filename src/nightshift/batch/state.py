"""What the server's routes share: its settings, the store, the queue, the key check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from nightshift.batch.execute import ServeSettings
from nightshift.batch.http import check_key, parse_json
from nightshift.batch.queue import BatchQueue
from nightshift.batch.records import content_lines
from nightshift.batch.store import BatchStore


@dataclass
class ServerState:
    settings: ServeSettings
    batches: BatchStore
    queue: BatchQueue

    @property
    def auth(self) -> Any:
        """A route dependency: 401 unless the request carries the server's key."""

        def authorized(request: Request) -> None:
            check_key(request, self.settings.api_key)

        return Depends(authorized)

    @staticmethod
    async def json_body(request: Request) -> dict[str, Any]:
        """The request body as a JSON object, or a 400 that says what is wrong; its
        shape is checked before it is parsed, off the event loop (``http.parse_json``)."""
        raw = await request.body()
        return await run_in_threadpool(parse_json, raw)


def count_lines(content: bytes) -> int:
    """Requests in a JSONL file: its non-blank lines, split as conversion splits them."""
    return sum(1 for _ in content_lines(content))
