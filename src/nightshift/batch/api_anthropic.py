"""The Anthropic Message Batches API, as the ``anthropic`` SDK calls it.

Objects have the SDK's ``MessageBatch`` shape; results are JSONL lines of
``MessageBatchIndividualResponse`` (``succeeded``, ``errored``, and ``canceled`` for
requests a cancel kept from running). Lists run newest first, paged with ``before_id``,
``after_id`` and ``limit``. ``results_url`` starts with the server's public URL
(``--public-url``, else the bind address), never with the request's Host: the SDK sends
the API key to whatever that URL names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from nightshift.batch.http import ApiError
from nightshift.batch.lifecycle import announce, mark_cancelling, new_record
from nightshift.batch.state import ServerState, Shared, keyed_router
from nightshift.batch.store import UNFINISHED, new_id, valid_id

_CUSTOM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PROCESSING = {
    "cancelling": "canceling",
    "completed": "ended",
    "failed": "ended",
    "cancelled": "ended",
    "expired": "ended",
}


def anthropic_router() -> APIRouter:
    """The Anthropic routes, in the order they are matched; each handler is below."""
    routes = (
        ("POST", "", create_batch),
        ("GET", "/{batch_id}", retrieve_batch),
        ("GET", "/{batch_id}/results", batch_results),
        ("POST", "/{batch_id}/cancel", cancel_batch),
        ("GET", "", list_batches),
    )
    return keyed_router("/v1/messages/batches", routes)


async def create_batch(request: Request, state: Shared) -> dict:
    body = await state.json_body(request)
    lines = await run_in_threadpool(_request_lines, body.get("requests"), state.settings.max_lines)
    batch_id = new_id("msgbatch")
    data = ("\n".join(lines) + "\n").encode()
    key = state.batches.input_key(batch_id)  # the store may be a bucket: off the loop
    await run_in_threadpool(state.batches.store.put_bytes, key, data)
    window = state.settings.expire_after_s
    record = new_record("anthropic", batch_id, len(lines), window, endpoint="/v1/messages")
    await run_in_threadpool(state.batches.put_batch, record)
    announce(record, "received")
    state.queue.wake()
    return message_batch(record, state.base_url)


def retrieve_batch(state: Shared, batch_id: str) -> dict:
    return message_batch(_batch(state, batch_id), state.base_url)


def batch_results(state: Shared, batch_id: str) -> StreamingResponse:
    record = _batch(state, batch_id)
    if record["status"] in UNFINISHED:
        raise ApiError(400, f"batch {batch_id} has not ended yet: no results")
    missing = [
        f for f in record["results"] if not state.batches.store.exists(state.batches.file_key(f))
    ]
    if missing:  # said before the headers: a 200 must carry every line
        raise ApiError(404, f"the results of batch {batch_id} are missing from the store")
    return StreamingResponse(_results(state, record), media_type="application/x-jsonl")


def cancel_batch(state: Shared, batch_id: str) -> dict:
    record = _batch(state, batch_id)
    if record["status"] not in ("validating", "in_progress", "cancelling"):
        raise ApiError(409, f"batch {batch_id} has ended: nothing to cancel")
    record = mark_cancelling(state.batches, batch_id) or record
    state.queue.cancel(batch_id)
    return message_batch(state.batches.batch(batch_id) or record, state.base_url)


def list_batches(
    state: Shared,
    before_id: str | None = None,
    after_id: str | None = None,
    limit: int = 20,
) -> dict:
    if not 1 <= limit <= 1000:
        raise ApiError(400, "limit must be between 1 and 1000")
    ids = state.batches.batch_ids("msgbatch")[::-1]  # keys only: one page of records
    page, has_more = _page(state, ids, before_id, after_id, limit)
    data = [message_batch(r, state.base_url) for r in page]
    return {
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def message_batch(record: dict[str, Any], base: str) -> dict[str, Any]:
    status = _PROCESSING.get(record["status"], "in_progress")
    # live while it runs (batch.progress): those answered so far, the rest processing
    counts, ended = record["request_counts"], status == "ended"
    done = counts["completed"] + counts["failed"]
    cancelled = record["status"] == "cancelled"
    expired = record.get("expired_requests", 0)  # failed ones its window ended
    results_url = f"{base}/v1/messages/batches/{record['id']}/results"
    return {
        "id": record["id"],
        "type": "message_batch",
        "processing_status": status,
        "request_counts": {
            "processing": 0 if ended else counts["total"] - done,
            "succeeded": counts["completed"],
            "errored": counts["failed"]
            - expired
            + (counts["total"] if record["status"] == "failed" and not done else 0),
            "canceled": counts["total"] - done if cancelled else 0,
            "expired": expired,
        },
        "created_at": _rfc3339(record["created_at"]),
        "expires_at": _rfc3339(record["expires_at"]),
        "ended_at": _rfc3339(
            record["completed_at"]
            or record["failed_at"]
            or record["cancelled_at"]
            or record.get("expired_at")
        ),
        "cancel_initiated_at": _rfc3339(record["cancelling_at"]),
        "archived_at": None,
        "results_url": results_url if ended else None,
    }


def _request_lines(requests: object, max_lines: int) -> list[str]:
    """Each request as an input line; a batch Anthropic would refuse gets a 400."""
    if not isinstance(requests, list) or not requests:
        raise ApiError(400, "requests: a non-empty list of {custom_id, params} is required")
    if len(requests) > max_lines:
        raise ApiError(413, f"requests: over the limit of {max_lines} requests")
    seen: set[str] = set()
    lines = []
    for i, item in enumerate(requests):
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
        if not isinstance(custom_id, str) or not _CUSTOM_ID.fullmatch(custom_id):
            raise ApiError(400, f"requests.{i}.custom_id: 1-64 letters, digits, _ or -")
        if custom_id in seen:
            raise ApiError(400, f"requests.{i}.custom_id: {custom_id!r} is used twice")
        if not isinstance(item.get("params"), dict):
            raise ApiError(400, f"requests.{i}.params: an object is required")
        seen.add(custom_id)
        lines.append(json.dumps({"custom_id": custom_id, "params": item["params"]}))
    return lines


def _page(state: ServerState, ids: list[str], before: str | None, after: str | None, limit: int):
    """The page of ``ids`` (newest first) before or after a cursor; only its records
    are read."""
    for name, value in (("before_id", before), ("after_id", after)):
        if value is not None and not valid_id("msgbatch", value):
            raise ApiError(400, f"{name} must be a message batch id")
    if before is not None:
        end = ids.index(before) if before in ids else 0
        page, more = state.batches.read_page(ids[:end][::-1], limit)
        return page[::-1], more
    start = ids.index(after) + 1 if after in ids else (0 if after is None else len(ids))
    return state.batches.read_page(ids[start:], limit)


def _results(state: ServerState, record: dict[str, Any]) -> Iterator[bytes]:
    for file_id in record["results"]:
        content = state.batches.file_content(file_id)
        yield content if content.endswith(b"\n") else content + b"\n"


def _rfc3339(stamp: int | None) -> str | None:
    if stamp is None:
        return None
    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _batch(state: ServerState, batch_id: str) -> dict:
    record = state.batches.batch(batch_id) if valid_id("msgbatch", batch_id) else None
    if record is None:
        raise ApiError(404, f"no such message batch: {batch_id[:80]!r}")
    return record
