"""The batch server's index (``batch.store``): the idle worker, the lists and file
deletes read the keys they need, never every batch record, and a crash between any two
writes never loses an unfinished batch.

Reads are counted by a wrapper around the store, not timed; the HTTP paths are driven
in-process by the official clients (``create_app`` on the counted store).
"""

from __future__ import annotations

import json
import time
from collections import Counter

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from nightshift.batch.execute import ServeSettings
from nightshift.batch.lifecycle import finish, new_record
from nightshift.batch.queue import BatchQueue
from nightshift.batch.server import create_app
from nightshift.batch.store import INDEX_DONE, BatchStore, file_object, new_id
from nightshift.io.objectstore import LocalStore

from .batchserver import KEY

COUNTS = {"total": 1, "completed": 1, "failed": 0}
COUNTS |= {"input_tokens": 3, "output_tokens": 2, "cached_tokens": 0}


class Crash(Exception):
    """A process killed between two writes."""


class CountingStore:
    """The store, with each read counted by its top folder (``batches``, ``pending``...)
    and each write passed to ``before_write`` (which may raise ``Crash``)."""

    def __init__(self, inner: LocalStore) -> None:
        self.inner, self.reads, self.lists = inner, Counter(), []
        self.before_write = lambda key: None

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def get_bytes(self, key: str) -> bytes:
        self.reads[key.split("/")[0]] += 1
        return self.inner.get_bytes(key)

    def exists(self, key: str) -> bool:
        self.reads[key.split("/")[0]] += 1
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        self.lists.append(prefix)
        return self.inner.list(prefix)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.before_write(key)
        self.inner.put_bytes(key, data)

    def delete(self, keys) -> None:
        keys = list(keys)
        for key in keys:
            self.before_write(key)
        self.inner.delete(keys)

    def reset(self) -> None:
        self.reads.clear()
        self.lists.clear()


def uploaded(batches: BatchStore, name: str = "in.jsonl") -> str:
    file_id = new_id("file")
    batches.store.put_bytes(batches.file_key(file_id), b'{"custom_id": "a"}\n')
    batches.put_file_meta(file_object(file_id, 19, name, "batch"))
    return file_id


def openai_record(input_id: str, seq: int | None = None) -> dict:
    record = new_record(
        "openai",
        new_id("batch"),
        1,
        endpoint="/v1/chat/completions",
        input_file_id=input_id,
        completion_window="24h",
        metadata=None,
    )
    return record if seq is None else {**record, "seq": seq}


def anthropic_record(seq: int | None = None) -> dict:
    record = new_record("anthropic", new_id("msgbatch"), 1, endpoint="/v1/messages")
    return record if seq is None else {**record, "seq": seq}


def completed(batches: BatchStore, batch_id: str) -> None:
    now = int(time.time())
    batches.update_batch(batch_id, lambda r: {**r, "status": "completed", "completed_at": now})


@pytest.fixture
def counted(tmp_path):
    store = CountingStore(LocalStore(tmp_path / "store"))
    return store, BatchStore(store)


def test_an_idle_worker_reads_no_record_of_a_finished_batch(counted):
    store, batches = counted
    input_id = uploaded(batches)
    for seq in range(300):
        record = openai_record(input_id, seq) if seq % 2 else anthropic_record(seq)
        assert batches.put_batch(record)
        completed(batches, record["id"])
    queue = BatchQueue(batches, lambda record: COUNTS, lambda *a, **k: None)
    store.reset()
    assert queue._next() is None
    assert store.reads["batches"] == 0 and store.lists == ["pending/"]

    waiting = [openai_record(input_id, 1000), anthropic_record(999)]
    for record in waiting:
        batches.put_batch(record)
    store.reset()
    assert queue._next()["id"] == waiting[1]["id"]  # the queue's order: seq first
    assert store.reads["batches"] == 1


def test_lists_read_one_page_of_records_and_page_in_order(counted):
    store, batches = counted
    input_id = uploaded(batches)
    ours = [openai_record(input_id, seq) for seq in range(1, 120)]
    theirs = [anthropic_record(seq) for seq in range(1, 120)]
    for record in ours + theirs:
        batches.put_batch(record)
        completed(batches, record["id"])
    newest = [r["id"] for r in ours[::-1]]
    newest_msg = [r["id"] for r in theirs[::-1]]
    settings = ServeSettings(model="demo", store=batches.store.root, api_key=KEY)
    app = create_app(settings, run=lambda record: COUNTS, batches=batches)
    with TestClient(app) as http:
        oai = openai.OpenAI(
            base_url="http://testserver/v1", api_key=KEY, http_client=http, max_retries=0
        )
        ant = anthropic.Anthropic(
            base_url="http://testserver", api_key=KEY, http_client=http, max_retries=0
        )
        store.reset()
        page = oai.batches.list(limit=1)
        assert [b.id for b in page.data] == newest[:1] and page.has_more
        assert store.reads["batches"] == 1
        store.reset()
        assert [b.id for b in oai.batches.list(limit=7)] == newest  # every page, by after
        assert store.reads["batches"] == len(newest)
        assert oai.batches.list(limit=5, after=newest[-5]).has_more is False

        store.reset()
        first = ant.messages.batches.list(limit=2)
        assert [b.id for b in first.data] == newest_msg[:2] and first.has_more
        assert store.reads["batches"] == 2
        later = ant.messages.batches.list(limit=3, after_id=newest_msg[10])
        assert [b.id for b in later.data] == newest_msg[11:14]
        earlier = ant.messages.batches.list(limit=3, before_id=newest_msg[10])
        assert [b.id for b in earlier.data] == newest_msg[7:10] and earlier.has_more
        assert [b.id for b in ant.messages.batches.list(limit=50)] == newest_msg


def test_deleting_a_file_reads_only_the_batches_that_named_it(counted):
    store, batches = counted
    shared, busy, spare = (uploaded(batches, f"{n}.jsonl") for n in ("a", "b", "c"))
    for seq in range(200):
        record = openai_record(shared, seq)
        batches.put_batch(record)
        completed(batches, record["id"])
    output = record["output_file_id"]  # the last one's results
    batches.store.put_bytes(batches.file_key(output), b'{"custom_id": "a"}\n')
    batches.register_output(output, "batch_output", "out.jsonl")
    running = openai_record(busy, 1000)
    batches.put_batch(running)
    settings = ServeSettings(model="demo", store=batches.store.root, api_key=KEY)
    http = TestClient(create_app(settings, run=lambda record: COUNTS, batches=batches))
    oai = openai.OpenAI(
        base_url="http://testserver/v1", api_key=KEY, http_client=http, max_retries=0
    )  # no lifespan: no worker runs the waiting batch
    store.reset()
    assert oai.files.delete(spare).deleted
    assert store.reads["batches"] == 0
    with pytest.raises(openai.ConflictError, match=running["id"]):
        oai.files.delete(busy)  # the input of a batch still to run
    with pytest.raises(openai.ConflictError, match=record["id"]):
        oai.files.delete(output)  # a result of a batch that exists
    assert store.reads["batches"] == 2
    assert oai.files.retrieve(busy).id == busy and oai.files.retrieve(output).id == output
    store.reset()
    assert oai.files.delete(shared).deleted  # the input of 200 batches, all ended
    assert store.reads["batches"] == 200
    assert "batches/" not in store.lists and not store.inner.list(f"owners/{shared}/")


def crashing_at(write: int):
    """A ``before_write`` that crashes at the ``write``-th write (from 0)."""
    writes = iter(range(10**6))

    def crash(key: str) -> None:
        if next(writes) == write:
            raise Crash(key)

    return crash


def test_a_crash_at_any_write_of_a_create_or_an_end_loses_no_unfinished_batch(tmp_path):
    for crash_at in range(12):
        root = tmp_path / f"store-{crash_at}"
        store = CountingStore(LocalStore(root))
        batches = BatchStore(store)
        input_id = uploaded(batches)
        store.inner.put_bytes(INDEX_DONE, b"")  # a store a running server has indexed
        store.before_write = crashing_at(crash_at)
        record = openai_record(input_id)
        try:
            batches.put_batch(record)
            finish(batches, record, COUNTS, "completed")
        except Crash:
            pass
        again = BatchStore(LocalStore(root))  # the next start, on what was written
        again.ensure_index()
        found = again.batch(record["id"])
        waiting = again.next_unfinished()
        if found is None:
            assert waiting is None, crash_at  # never created: the client got an error
        elif found["status"] == "completed":
            assert waiting is None, crash_at
            assert not again.store.list("pending/"), crash_at  # an ended one's key goes
        else:
            assert waiting and waiting["id"] == record["id"], (crash_at, found["status"])
        if found is not None:
            assert again.batch_ids("batch") == [record["id"]]
            assert again.file_user(record["output_file_id"]) == record["id"]
            needs_input = found["status"] != "completed"
            assert again.file_user(input_id) == (record["id"] if needs_input else None)


def test_a_pending_key_without_its_record_waits_for_it_then_goes(counted, monkeypatch):
    store, batches = counted
    record = anthropic_record()
    key = f"pending/{record['seq']:020d}-{record['id']}"
    store.put_bytes(key, b"")  # a create half-way: its record is written next
    assert batches.next_unfinished() is None and store.exists(key)
    monkeypatch.setattr("nightshift.batch.store._ORPHAN_NS", 0)  # ... or it never was
    assert batches.next_unfinished() is None and not store.exists(key)


def test_a_store_from_before_the_index_is_indexed_at_the_start(tmp_path):
    root = tmp_path / "store"
    old = LocalStore(root)
    batches = BatchStore(old)
    input_id = uploaded(batches)
    records = [openai_record(input_id, seq) for seq in range(1, 4)]
    records[0]["status"] = "completed"
    for record in records:  # as the server wrote them before the index: records alone
        old.put_bytes(f"batches/{record['id']}.json", json.dumps(record).encode())
    ran: list[str] = []

    def run(record: dict) -> dict:
        ran.append(record["id"])
        return COUNTS

    settings = ServeSettings(model="demo", store=str(root), api_key=KEY)
    with TestClient(create_app(settings, run=run)) as http:
        oai = openai.OpenAI(
            base_url="http://testserver/v1", api_key=KEY, http_client=http, max_retries=0
        )
        assert [b.id for b in oai.batches.list()] == [r["id"] for r in records[::-1]]
        for record in records[1:]:
            deadline = time.monotonic() + 30
            while oai.batches.retrieve(record["id"]).status != "completed":
                assert time.monotonic() < deadline, ran
                time.sleep(0.1)
    assert ran == [r["id"] for r in records[1:]]
    indexed = BatchStore(LocalStore(root))
    assert [indexed.file_user(r["output_file_id"]) for r in records] == [r["id"] for r in records]
