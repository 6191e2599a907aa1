"""The OpenAI Batch API: files, batches and models, as the ``openai`` SDK calls them.

Batch objects carry every field of ``openai.types.Batch``; result files are Files of
purpose ``batch_output``. Lists run newest first with cursor pagination (``after`` an
id, ``limit``), as OpenAI's do.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from nightshift.batch.http import ApiError
from nightshift.batch.lifecycle import announce, mark_cancelling, new_record
from nightshift.batch.openai import ENDPOINTS
from nightshift.batch.state import ServerState, Shared, count_lines, keyed_router
from nightshift.batch.store import file_object, new_id, valid_id

_CHUNK = 1 << 20


def openai_router() -> APIRouter:
    """The OpenAI routes, in the order they are matched; each handler is below."""
    routes = (
        ("POST", "/files", upload_file),
        ("GET", "/files/{file_id}", retrieve_file),
        ("GET", "/files/{file_id}/content", file_content),
        ("GET", "/files", list_files),
        ("DELETE", "/files/{file_id}", delete_file),
        ("POST", "/batches", create_batch),
        ("GET", "/batches/{batch_id}", retrieve_batch),
        ("POST", "/batches/{batch_id}/cancel", cancel_batch),
        ("GET", "/batches", list_batches),
        ("GET", "/models", list_models),
        ("GET", "/models/{name:path}", retrieve_model),
    )
    return keyed_router("/v1", routes)


async def upload_file(request: Request, state: Shared) -> dict:
    form = await request.form(max_files=1, max_fields=10)
    purpose, upload = form.get("purpose"), form.get("file")
    if purpose != "batch":
        raise ApiError(400, "purpose must be 'batch'", param="purpose")
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "a file is required (multipart field 'file')", param="file")
    file_id = new_id("file")
    size = await _save_upload(state, upload, file_id)
    meta = file_object(file_id, size, upload.filename or "upload.jsonl", "batch")
    await run_in_threadpool(state.batches.put_file_meta, meta)
    return meta


def retrieve_file(state: Shared, file_id: str) -> dict:
    return _file(state, file_id)


def file_content(state: Shared, file_id: str) -> Response:
    _file(state, file_id)
    content = state.batches.file_content(file_id)
    return Response(content, media_type="application/jsonl")


def list_files(
    state: Shared,
    purpose: str | None = None,
    limit: int = 10_000,
    order: str = "desc",
    after: str | None = None,
) -> dict:
    if not 1 <= limit <= 10_000:
        raise ApiError(400, "limit must be between 1 and 10000", param="limit")
    if order not in ("asc", "desc"):
        raise ApiError(400, "order must be 'asc' or 'desc'", param="order")
    metas = [m for m in state.batches.files() if purpose in (None, m["purpose"])]
    return _list_page(metas if order == "asc" else metas[::-1], after, limit, "file")


def delete_file(state: Shared, file_id: str) -> dict:
    _file(state, file_id)
    user = state.batches.delete_file(file_id)
    if user is not None:
        raise ApiError(
            409,
            f"file {file_id} is needed by batch {user}: a batch's results are kept "
            "while it exists, its input until it ends",
            param="file_id",
            code="file_in_use",
        )
    return {"id": file_id, "object": "file", "deleted": True}


async def create_batch(request: Request, state: Shared) -> dict:
    body = await state.json_body(request)
    input_id, endpoint = body.get("input_file_id"), body.get("endpoint")
    meta = _file(state, input_id, param="input_file_id")
    if meta["purpose"] != "batch":
        raise ApiError(400, f"file {input_id} is not a batch input", param="input_file_id")
    if endpoint not in ENDPOINTS:
        raise ApiError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", "endpoint")
    if body.get("completion_window", "24h") != "24h":
        raise ApiError(400, "completion_window must be '24h'", param="completion_window")
    metadata = _metadata(body.get("metadata"))
    total = await run_in_threadpool(_count_requests, state, input_id)
    record = new_record(
        "openai",
        new_id("batch"),
        total,
        state.settings.expire_after_s,
        endpoint=endpoint,
        input_file_id=input_id,
        completion_window="24h",
        metadata=metadata,
    )
    if not await run_in_threadpool(state.batches.put_batch, record, (input_id,)):
        raise ApiError(404, f"no such file: {input_id!r}", param="input_file_id")
    announce(record, "received")
    state.queue.wake()
    return batch_object(record, state)


def retrieve_batch(state: Shared, batch_id: str) -> dict:
    return batch_object(_batch(state, batch_id), state)


def cancel_batch(state: Shared, batch_id: str) -> dict:
    record = _batch(state, batch_id)
    if record["status"] not in ("validating", "in_progress", "cancelling"):
        raise ApiError(409, f"cannot cancel a batch that is {record['status']}")
    record = mark_cancelling(state.batches, batch_id) or record
    state.queue.cancel(batch_id)
    return batch_object(state.batches.batch(batch_id) or record, state)


def list_batches(state: Shared, after: str | None = None, limit: int = 20) -> dict:
    if not 1 <= limit <= 100:
        raise ApiError(400, "limit must be between 1 and 100", param="limit")
    ids = state.batches.batch_ids("batch")[::-1]  # keys only: one page of records read
    start = _after(ids, after, "batch")
    records, has_more = state.batches.read_page(ids[start:], limit)
    return _page_object([batch_object(r, state) for r in records], has_more)


def list_models(state: Shared) -> dict:
    return {"object": "list", "data": _models(state)}


def retrieve_model(state: Shared, name: str) -> dict:
    found = [m for m in _models(state) if m["id"] == name]
    if not found:
        raise ApiError(404, f"no such model: {name[:80]!r}", param="model")
    return found[0]


def _models(state: ServerState) -> list[dict[str, Any]]:
    """The model objects of every name a request may give (``model_names``)."""
    now = int(time.time())
    return [
        {"id": name, "object": "model", "created": now, "owned_by": "nightshift"}
        for name in state.settings.model_names()
    ]


def batch_object(record: dict[str, Any], state: ServerState) -> dict[str, Any]:
    usage = record["usage"]
    errors = record["errors"]
    return {
        "id": record["id"],
        "object": "batch",
        "endpoint": record["endpoint"],
        "model": state.settings.model_names()[0],
        "errors": None
        if not errors
        else {"object": "list", "data": [{"line": None, "param": None, **e} for e in errors]},
        "input_file_id": record["input_file_id"],
        "completion_window": record["completion_window"],
        "status": record["status"],
        "output_file_id": record["output_file_id"] if record["results"] else None,
        "error_file_id": record["error_file_id"] if record["results"] else None,
        **{
            f"{t}_at": record[f"{t}_at"]
            for t in ("created", "in_progress", "expires", "finalizing", "completed")
        },
        **{f"{t}_at": record[f"{t}_at"] for t in ("failed", "cancelling", "cancelled")},
        "expired_at": record.get("expired_at"),
        "request_counts": record["request_counts"],
        "usage": None if usage is None else _usage(usage),
        "metadata": record["metadata"],
    }


def _metadata(metadata: object) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 string keys (64 chars) to string values (512)."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > 16:
        raise ApiError(400, "metadata must be an object of at most 16 pairs", "metadata")
    for key, value in metadata.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
            raise ApiError(
                400,
                f"metadata.{key[:64]}: keys are strings of at most 64 characters, "
                "values strings of at most 512",
                f"metadata.{key[:64]}",
            )
    return metadata


def _count_requests(state: ServerState, file_id: str) -> int:
    return count_lines(state.batches.file_content(file_id))


def _usage(usage: dict[str, int]) -> dict[str, Any]:
    return {
        "input_tokens": usage["input"],
        "input_tokens_details": {"cached_tokens": usage["cached"]},
        "output_tokens": usage["output"],
        "output_tokens_details": {"reasoning_tokens": usage.get("reasoning", 0)},
        "total_tokens": usage["input"] + usage["output"],
    }


def _list_page(objects: list[dict], after: str | None, limit: int, kind: str) -> dict:
    """One page of a list, OpenAI's cursor pagination: the ``limit`` objects after the
    one with id ``after``."""
    start = _after([o["id"] for o in objects], after, kind)
    return _page_object(objects[start : start + limit], start + limit < len(objects))


def _after(ids: list[str], after: str | None, kind: str) -> int:
    """Where the page after the id ``after`` starts in ``ids`` (past the end if it is
    not there)."""
    if after is None:
        return 0
    if not valid_id(kind, after):
        raise ApiError(400, f"after must be a {kind} id", param="after")
    return ids.index(after) + 1 if after in ids else len(ids)


def _page_object(data: list[dict], has_more: bool) -> dict:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def _file(state: ServerState, file_id: object, param: str = "file_id") -> dict:
    meta = state.batches.file_meta(file_id) if valid_id("file", file_id) else None
    if meta is None:
        raise ApiError(404, f"no such file: {str(file_id)[:80]!r}", param=param)
    return meta


def _batch(state: ServerState, batch_id: str) -> dict:
    record = state.batches.batch(batch_id) if valid_id("batch", batch_id) else None
    if record is None:
        raise ApiError(404, f"no such batch: {batch_id[:80]!r}", param="batch_id")
    return record


async def _save_upload(state: ServerState, upload: UploadFile, file_id: str) -> int:
    """Copy the upload into the store; one over the byte or line limit gets 413."""
    import tempfile
    from pathlib import Path

    limits = state.settings
    size = lines = 0
    last = b"\n"
    with tempfile.NamedTemporaryFile(prefix="nightshift-upload-") as temp:
        while chunk := await upload.read(_CHUNK):
            size, lines = size + len(chunk), lines + chunk.count(b"\n")
            if size > limits.max_bytes or lines > limits.max_lines:
                raise ApiError(
                    413,
                    f"the file is over the limit of {limits.max_bytes} bytes "
                    f"or {limits.max_lines} lines",
                    param="file",
                    code="file_too_large",
                )
            temp.write(chunk)
            last = chunk
        if lines == limits.max_lines and not last.endswith(b"\n"):
            raise ApiError(
                413, f"the file is over {limits.max_lines} lines", "file", "file_too_large"
            )
        temp.flush()
        key = state.batches.file_key(file_id)  # the store may be a bucket: off the loop
        await run_in_threadpool(state.batches.store.put_file, key, Path(temp.name))
    return size
