"""Files and batch records of ``nightshift batch serve``, kept in one object store.

Everything the server knows lives here, so a server killed at any moment and started
again on the same store knows it too. Layout under the store's root::

    files/<file-id>.json        a file's metadata (the OpenAI File object)
    files/<file-id>.jsonl       its content (uploads, batch outputs and errors)
    batches/<batch-id>.json     a batch record (OpenAI batch_… or Anthropic msgbatch_…)
    inputs/<msgbatch-id>.jsonl  an Anthropic batch's requests, one per line
    work/<batch-id>/            the batch's resumable job (``run_batch``'s work folder)

A record is written after what it names (the input first), so a record never points at
something missing. Ids are random (``secrets.token_hex``) and every id from a request is
checked against a strict pattern before it becomes part of a key: nothing a client sends
can reach outside these folders, on disk or in a bucket.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from nightshift.errors import ObjectNotFound
from nightshift.io.objectstore import ObjectStore, open_store

KINDS = {"file": "file-", "batch": "batch_", "msgbatch": "msgbatch_"}
_ID = {kind: re.compile(rf"^{re.escape(prefix)}[0-9a-f]{{32}}$") for kind, prefix in KINDS.items()}
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")


def new_id(kind: str) -> str:
    return f"{KINDS[kind]}{secrets.token_hex(16)}"


def valid_id(kind: str, value: object) -> bool:
    return isinstance(value, str) and _ID[kind].fullmatch(value) is not None


def batch_kind(batch_id: str) -> str:
    return "msgbatch" if batch_id.startswith(KINDS["msgbatch"]) else "batch"


class BatchStore:
    """Read and write files and batch records; ids must be checked by the caller
    (``valid_id``) and are checked again here, so a bad one never becomes a key."""

    def __init__(self, location: str | ObjectStore) -> None:
        self.store = open_store(location) if isinstance(location, str) else location
        self._lock = threading.Lock()  # read-modify-write of records (API vs worker)

    # files
    def file_key(self, file_id: str) -> str:
        return f"files/{_checked('file', file_id)}.jsonl"

    def file_uri(self, file_id: str) -> str:
        return self.store.uri(self.file_key(file_id))

    def put_file_meta(self, meta: dict[str, Any]) -> None:
        self._put_json(f"files/{_checked('file', meta['id'])}.json", meta)

    def file_meta(self, file_id: str) -> dict[str, Any] | None:
        return self._get_json(f"files/{_checked('file', file_id)}.json")

    def file_content(self, file_id: str) -> bytes:
        return self.store.get_bytes(self.file_key(file_id))

    def files(self) -> list[dict[str, Any]]:
        """Every File object, oldest first."""
        metas = []
        for key in self.store.list("files/"):
            name = key.removeprefix("files/").removesuffix(".json")
            if key.endswith(".json") and valid_id("file", name):
                meta = self._get_json(key)
                if meta is not None:
                    metas.append(meta)
        return sorted(metas, key=lambda m: (m["created_at"], m["id"]))

    def delete_file(self, file_id: str) -> None:
        """Its metadata first: a file is gone once its File object is."""
        self.store.delete([f"files/{_checked('file', file_id)}.json"])
        self.store.delete([self.file_key(file_id)])

    def register_output(self, file_id: str, purpose: str, filename: str) -> dict | None:
        """The File object of a result ``run_batch`` wrote, or None if it wrote none."""
        meta = self.file_meta(file_id)
        if meta is not None:
            return meta
        try:
            size = len(self.file_content(file_id))
        except ObjectNotFound:
            return None
        meta = file_object(file_id, size, filename, purpose)
        self.put_file_meta(meta)
        return meta

    # batches
    def input_key(self, batch_id: str) -> str:
        return f"inputs/{_checked('msgbatch', batch_id)}.jsonl"

    def work_uri(self, batch_id: str) -> str:
        return self.store.uri(f"work/{_checked(batch_kind(batch_id), batch_id)}")

    def put_batch(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._put_json(_batch_key(record["id"]), record)

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        return self._get_json(_batch_key(batch_id))

    def update_batch(
        self, batch_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Apply ``change`` to the record atomically in this process; ``change`` returns
        the new record, or None to leave it as it is."""
        with self._lock:
            record = self.batch(batch_id)
            if record is None:
                return None
            new = change(dict(record))
            if new is None:
                return record
            self._put_json(_batch_key(batch_id), new)
            return new

    def batches(self, kind: str) -> list[dict[str, Any]]:
        """Every batch record of ``kind``, oldest first (the queue's order)."""
        records = []
        for key in self.store.list(f"batches/{KINDS[kind]}"):
            name = key.removeprefix("batches/").removesuffix(".json")
            if key.endswith(".json") and valid_id(kind, name):
                record = self._get_json(key)
                if record is not None:
                    records.append(record)
        return sorted(records, key=lambda r: (r["seq"], r["id"]))

    def _put_json(self, key: str, value: dict[str, Any]) -> None:
        self.store.put_bytes(key, json.dumps(value).encode())

    def _get_json(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.store.get_bytes(key))
        except ObjectNotFound:
            return None


def file_object(file_id: str, size: int, filename: str, purpose: str) -> dict[str, Any]:
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": int(time.time()),
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def next_seq() -> int:
    """The queue position of a new batch: nanoseconds, so it survives restarts."""
    return time.time_ns()


def _batch_key(batch_id: str) -> str:
    return f"batches/{_checked(batch_kind(batch_id), batch_id)}.json"


def _checked(kind: str, value: str) -> str:
    if not valid_id(kind, value):
        raise ValueError(f"not a {kind} id: {value!r}")
    return value
