"""A batch record's life: created (queued), run, finished; one shape for both providers.

The record keeps OpenAI's statuses and timestamps (``api_anthropic`` maps them onto
Anthropic's ``processing_status``). Result file ids are drawn when the batch is created,
so a job resumed after a kill writes to the same files.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from nightshift.batch.store import BatchStore, new_id, next_seq
from nightshift.errors import ObjectNotFound
from nightshift.faults import crash_point

DAY_S = 24 * 3600
log = logging.getLogger("nightshift.batch")


def announce(record: dict[str, Any], what: str) -> None:
    """One line of the server's log for a step of a batch: its id, the step and its
    counts (never a request's content)."""
    c = record["request_counts"]
    log.info(
        "batch %s (%s): %s; %d completed, %d failed of %d requests",
        record["id"], record["provider"], what, c["completed"], c["failed"], c["total"],
    )  # fmt: skip


def new_record(
    provider: str, batch_id: str, total: int, window_s: int = DAY_S, **fields: Any
) -> dict[str, Any]:
    """A new batch record, queued; it expires ``window_s`` after now (``batch.progress``)."""
    now = int(time.time())
    return {
        "id": batch_id,
        "provider": provider,
        "seq": next_seq(),
        "status": "validating",
        "created_at": now,
        "expires_at": now + window_s,
        "in_progress_at": None,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "expired_at": None,
        "request_counts": {"total": total, "completed": 0, "failed": 0},
        "usage": None,
        "errors": None,
        "output_file_id": new_id("file"),
        "error_file_id": new_id("file"),
        "canceled_file_id": None,
        "results": [],  # the result file ids that exist, once finished
        **fields,
    }


def mark_cancelling(batches: BatchStore, batch_id: str) -> dict[str, Any] | None:
    def change(record: dict[str, Any]) -> dict[str, Any] | None:
        if record["status"] not in ("validating", "in_progress"):
            return None
        return {**record, "status": "cancelling", "cancelling_at": int(time.time())}

    return batches.update_batch(batch_id, change)


def finish(
    batches: BatchStore,
    record: dict[str, Any],
    counts: dict | None,
    how: str,
    errors: list[dict[str, Any]] | None = None,
) -> None:
    """Write the end state: ``how`` is "completed", "cancelled", "expired" or "failed: why";
    ``errors`` (OpenAI's ``{code, message, line, param}``) say why it failed, if given."""
    batch_id, now = record["id"], int(time.time())
    if counts is not None:
        batches.update_batch(
            batch_id, lambda r: {**r, "status": "finalizing", "finalizing_at": now}
        )
        crash_point("batch.finalizing")  # a kill now: the next start finalizes it again
    results = _result_files(batches, record)
    canceled = _unanswered_file(batches, record, results, _unanswered(how))

    def change(r: dict[str, Any]) -> dict[str, Any]:
        r = _with_results(r, record, results, canceled)
        if counts is not None:
            _set_counts(r, counts)
        _set_end(r, how, errors, now)
        return r

    ended = batches.update_batch(batch_id, change)
    if ended is not None:
        why = f": {ended['errors'][0]['message']}" if ended["status"] == "failed" else ""
        announce(ended, f"ended {ended['status']}{why}")


def _with_results(
    r: dict[str, Any], record: dict[str, Any], results: list[str], canceled: str | None
) -> dict[str, Any]:
    """``r`` with its result files: those that exist, the canceled one last; an output or
    error file id only where that file was written."""
    r = {**r, "results": results + ([canceled] if canceled else [])}
    r["canceled_file_id"] = canceled
    r["output_file_id"] = record["output_file_id"] if record["output_file_id"] in results else None
    r["error_file_id"] = record["error_file_id"] if record["error_file_id"] in results else None
    return r


def _set_counts(r: dict[str, Any], counts: dict) -> None:
    """The job's final request counts and token usage, into ``r``."""
    r["request_counts"] = {
        "total": counts["total"],
        "completed": counts["completed"],
        "failed": counts["failed"],
    }
    r["usage"] = {k: counts[f"{k}_tokens"] for k in ("input", "output", "cached")}
    r["usage"]["reasoning"] = counts.get("reasoning_tokens", 0)  # a record before it: 0
    # of the failed, those its window ended (Anthropic counts them apart)
    r["expired_requests"] = counts.get("expired", 0)


def _set_end(r: dict[str, Any], how: str, errors: list[dict[str, Any]] | None, now: int) -> None:
    """The end status and its time, into ``r``; a failed batch says why in ``errors``."""
    if how.startswith("failed"):
        message = how.partition(": ")[2] or "the batch failed"
        r.update(status="failed", failed_at=now)
        r["errors"] = errors or [{"code": "batch_failed", "message": message}]
    else:
        r.update(status=how, **{f"{how}_at": now})


def _result_files(batches: BatchStore, record: dict[str, Any]) -> list[str]:
    """The result files the job wrote (empty ones count as none), registered as Files."""
    found = []
    for key, suffix in (("output_file_id", "output"), ("error_file_id", "errors")):
        file_id = record[key]
        meta = batches.register_output(file_id, "batch_output", f"{record['id']}_{suffix}.jsonl")
        if meta is not None and meta["bytes"] > 0:
            found.append(file_id)
    return found


def _unanswered(how: str) -> dict[str, Any] | None:
    """The Anthropic result of a request its batch ended without answering: ``canceled``
    by a cancel, ``errored`` (naming why) when the batch failed; None otherwise."""
    if how == "cancelled":
        return {"type": "canceled"}
    if how.startswith("failed"):
        why = how.partition(": ")[2] or "the batch failed"
        message = f"the batch failed before this request ran: {why}"
        return {"type": "errored", "error": {"type": "error", "error": {
            "type": "api_error", "message": message}}}  # fmt: skip
    return None


def _unanswered_file(
    batches: BatchStore, record: dict, results: list[str], result: dict[str, Any] | None
) -> str | None:
    """Anthropic answers every request of a batch whatever ended it: those never run
    come back as ``result`` lines (canceled, or errored when the batch failed)."""
    if record["provider"] != "anthropic" or result is None:
        return None
    answered = {cid for file_id in results for cid in custom_ids(batches.file_content(file_id))}
    try:
        asked = custom_ids(batches.store.get_bytes(batches.input_key(record["id"])))
    except ObjectNotFound:
        asked = []
    lines = [
        json.dumps({"custom_id": cid, "result": result})
        for cid in dict.fromkeys(asked)
        if cid not in answered
    ]
    if not lines:
        return None
    file_id = new_id("file")
    batches.add_owner(file_id, record["id"])  # before it exists: never deletable
    batches.store.put_bytes(batches.file_key(file_id), ("\n".join(lines) + "\n").encode())
    suffix = result["type"]
    batches.register_output(file_id, "batch_output", f"{record['id']}_{suffix}.jsonl")
    return file_id


def custom_ids(content: bytes) -> list[str]:
    """The string ``custom_id`` of each JSON line that has one."""
    from nightshift.batch.records import BadRequest, content_lines, load_line

    found = []
    for _, line in content_lines(content):  # split and loaded as conversion does
        try:
            value = load_line(line).get("custom_id")
        except (BadRequest, AttributeError):
            continue
        if isinstance(value, str):
            found.append(value)
    return found
