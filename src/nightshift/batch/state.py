"""What the server's routes share: its settings, the store, the queue, the key check."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request

from nightshift.batch.execute import ServeSettings
from nightshift.batch.http import ApiError, check_key
from nightshift.batch.queue import BatchQueue
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
        """The request body as a JSON object, or a 400 that says what is wrong."""
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body


def count_lines(content: bytes) -> int:
    """Requests in a JSONL file: its non-blank lines."""
    return sum(1 for line in content.splitlines() if line.strip())
