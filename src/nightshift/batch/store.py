"""Files and batch records of ``nightshift batch serve``, kept in one object store.

Everything the server knows lives here, so a server killed at any moment and started
again on the same store knows it too. Layout under the store's root::

    files/<file-id>.json        a file's metadata (the OpenAI File object)
    files/<file-id>.jsonl       its content (uploads, batch outputs and errors)
    batches/<batch-id>.json     a batch record (OpenAI batch_… or Anthropic msgbatch_…)
    inputs/<msgbatch-id>.jsonl  an Anthropic batch's requests, one per line
    work/<batch-id>/            the batch's resumable job (``run_batch``'s work folder)
    index/<kind>/<seq>-<id>     empty: every batch, in creation order (lists page by it)
    pending/<seq>-<id>          empty: every unfinished batch, in queue order
    owners/<file-id>/<id>       empty: a batch that names the file (input or result)
    index/v1                    the index above is complete (written once it is)

Ids are random, so the ``<seq>-<id>`` keys are what sort: a list reads the keys and only
the records of its page, and the idle worker lists ``pending/`` alone. A record is
written after what it names and after its index keys (owners, listing, pending), and its
pending key goes only after the record says it ended; so a crash between any two writes
leaves at worst a key whose record is missing or ended, which readers skip and clean,
never an unfinished batch the worker cannot find. A store written before the index gets
it from its records at the server's start (``ensure_index``). Ids are checked against a
strict pattern before they become part of a key: nothing a client sends can reach
outside these folders, on disk or in a bucket.
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
INDEX_DONE = "index/v1"
# A pending or listing key whose record is still missing this long after its seq was
# left by a create that failed half-way (a create writes its record milliseconds later).
_ORPHAN_NS = 600 * 10**9


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

    def delete_file(self, file_id: str) -> str | None:
        """Delete the file unless a batch needs it; returns the batch that does (then
        nothing is deleted). Its metadata goes first: a file is gone once that is."""
        with self._lock:  # against a batch being created on it
            user = self.file_user(file_id)
            if user is not None:
                return user
            owners = self.store.list(f"owners/{_checked('file', file_id)}/")
            self.store.delete([f"files/{file_id}.json"])
            self.store.delete([self.file_key(file_id), *owners])
        return None

    def file_user(self, file_id: str) -> str | None:
        """A batch that needs the file, found from the file's owner keys (the batches
        that named it), not a scan: one whose result it is, or whose input while the
        batch has not ended (it runs, and resumes, from it). None if none does."""
        for key in self.store.list(f"owners/{_checked('file', file_id)}/"):
            batch_id = key.rsplit("/", 1)[-1]
            if not valid_id(batch_kind(batch_id), batch_id):
                continue
            record = self.batch(batch_id)
            if record is None:
                continue  # a create that failed half-way
            ended = record["status"] not in UNFINISHED
            if not (ended and file_id == record.get("input_file_id")):
                return batch_id
        return None

    def add_owner(self, file_id: str, batch_id: str) -> None:
        """Mark ``file_id`` as needed by ``batch_id`` (before the file is written)."""
        _checked(batch_kind(batch_id), batch_id)
        self.store.put_bytes(f"owners/{_checked('file', file_id)}/{batch_id}", b"")

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

    def put_batch(self, record: dict[str, Any], inputs: tuple[str, ...] = ()) -> bool:
        """Create a batch: its index keys, then the record. False (nothing written) if
        one of the ``inputs`` files is gone, deleted while the request was checked."""
        with self._lock:
            if any(self.file_meta(file_id) is None for file_id in inputs):
                return False
            self._index(record)
            self._put_json(_batch_key(record["id"]), record)
        return True

    def _index(self, record: dict[str, Any]) -> None:
        for file_id in _files_of(record):
            self.add_owner(file_id, record["id"])
        self.store.put_bytes(_listing_key(record), b"")
        if record["status"] in UNFINISHED:
            self.store.put_bytes(_pending_key(record), b"")

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
            if new["status"] not in UNFINISHED:  # only once the record says so
                self.store.delete([_pending_key(new)])
            return new

    def next_unfinished(self, skip: frozenset[str] = frozenset()) -> dict[str, Any] | None:
        """The oldest unfinished batch: reads the pending keys and their records only.
        A key whose record ended (a crash before the key went) is dropped; one whose
        record is missing is a create under way, or, once old, one that failed. Ids in
        ``skip`` are passed over (the worker's batches waiting out a store failure)."""
        for key in self.store.list("pending/"):
            batch_id = _indexed_id(key)
            if batch_id is None or batch_id in skip:
                continue
            record = self.batch(batch_id)
            if record is not None and record["status"] in UNFINISHED:
                return record
            if record is not None or _orphaned(key):
                self.store.delete([key])
        return None

    def batch_ids(self, kind: str) -> list[str]:
        """The ids of every batch of ``kind``, oldest first, from the listing keys
        alone: no record is read."""
        found = (_indexed_id(key) for key in self.store.list(f"index/{kind}/"))
        return [batch_id for batch_id in found if batch_id and valid_id(kind, batch_id)]

    def read_page(self, ids: list[str], limit: int) -> tuple[list[dict[str, Any]], bool]:
        """The records of the first ``limit`` ids that have one (a create that failed
        half-way leaves a listing key without), and whether ids remain after them."""
        page: list[dict[str, Any]] = []
        for used, batch_id in enumerate(ids, 1):
            record = self.batch(batch_id)
            if record is not None:
                page.append(record)
            if len(page) == limit:
                return page, used < len(ids)
        return page, False

    def ensure_index(self) -> None:
        """Index a store written before the index, from every record; done once (a
        crash half-way does it again at the next start)."""
        if self.store.exists(INDEX_DONE):
            return
        with self._lock:
            for kind in ("batch", "msgbatch"):
                for record in self.batches(kind):
                    self._index(record)
            self.store.put_bytes(INDEX_DONE, b"")

    def batches(self, kind: str) -> list[dict[str, Any]]:
        """Every batch record of ``kind``, oldest first: a full scan, for the index's
        rebuild (the queue and the lists read the index)."""
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


def _order_name(record: dict[str, Any]) -> str:
    """``<seq>-<id>``: sorts as the queue and the lists do (seq, then id)."""
    batch_id = record["id"]
    return f"{int(record['seq']):020d}-{_checked(batch_kind(batch_id), batch_id)}"


def _listing_key(record: dict[str, Any]) -> str:
    return f"index/{batch_kind(record['id'])}/{_order_name(record)}"


def _pending_key(record: dict[str, Any]) -> str:
    return f"pending/{_order_name(record)}"


def _indexed_id(key: str) -> str | None:
    seq, _, batch_id = key.rsplit("/", 1)[-1].partition("-")
    return batch_id if seq.isdigit() and valid_id(batch_kind(batch_id), batch_id) else None


def _orphaned(key: str) -> bool:
    seq = key.rsplit("/", 1)[-1].partition("-")[0]
    return time.time_ns() - int(seq) > _ORPHAN_NS


def _files_of(record: dict[str, Any]) -> list[str]:
    """The files a batch needs kept: its input and every result file it has or will."""
    named = [record.get(k) for k in ("input_file_id", "output_file_id", "error_file_id")]
    named += [record.get("canceled_file_id"), *record.get("results", [])]
    return [f for f in dict.fromkeys(named) if valid_id("file", f)]


def _batch_key(batch_id: str) -> str:
    return f"batches/{_checked(batch_kind(batch_id), batch_id)}.json"


def _checked(kind: str, value: str) -> str:
    if not valid_id(kind, value):
        raise ValueError(f"not a {kind} id: {value!r}")
    return value
