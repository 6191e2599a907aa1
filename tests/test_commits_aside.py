"""A finished shard commits on a thread of its own (``running.committing``): the engine
is fed meanwhile, commits keep their order and bound, and a commit that fails stops the
run with its error and loses nothing."""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.errors import StoreError
from nightshift.io.objectstore import LocalStore
from nightshift.io.outputs import JobOutput
from nightshift.io.shardstore import ShardStore
from nightshift.pipelines.flow import job_flow
from nightshift.running.committing import BackgroundCommits

from .conftest import spec_dict
from .durable import assert_exactly_once, committed_ids, generated_prompts


def test_commits_run_in_the_order_given_with_at_most_ahead_waiting():
    commits = BackgroundCommits(ahead=1)
    release = threading.Event()
    done: list[int] = []

    def commit(n: int):
        def run() -> None:
            if n == 0:
                release.wait(timeout=10)
            done.append(n)

        return run

    commits.submit(commit(0))  # written now (held back by ``release``)
    commits.submit(commit(1))  # the one allowed to wait
    began, returned = threading.Event(), threading.Event()

    def third() -> None:
        began.set()
        commits.submit(commit(2))
        returned.set()

    threading.Thread(target=third).start()
    assert began.wait(timeout=10)
    # the feeding thread waits: two finished shards are held already
    assert not returned.wait(timeout=0.5)
    release.set()
    assert returned.wait(timeout=10)
    commits.drain()
    assert done == [0, 1, 2]


def test_a_failed_commit_is_raised_in_the_feeding_thread_by_check_and_by_drain():
    def broken() -> None:
        raise StoreError("the bucket went away")

    commits = BackgroundCommits()
    commits.submit(broken)
    deadline = time.monotonic() + 10
    with pytest.raises(StoreError, match="went away"):
        while time.monotonic() < deadline:
            commits.check()
            time.sleep(0.01)
    commits.submit(broken)
    with pytest.raises(StoreError, match="went away"):
        commits.drain()
    commits.drain()  # nothing left: returns


def test_abandoning_logs_a_failed_commit_and_waits_for_the_rest(caplog):
    done: list[str] = []
    both_in = threading.Event()

    def broken() -> None:
        both_in.wait(timeout=10)
        raise StoreError("the bucket went away")

    commits = BackgroundCommits(ahead=5)
    commits.submit(broken)
    commits.submit(lambda: done.append("after"))
    both_in.set()
    with caplog.at_level(logging.ERROR, logger="nightshift.running.committing"):
        commits.abandon_errors()
    assert done == ["after"]
    assert "went away" in caplog.text


def test_drain_raises_the_first_failure_and_logs_the_others(caplog):
    hold = threading.Event()

    def broken(n: int):
        def run() -> None:
            hold.wait(timeout=10)
            raise StoreError(f"commit {n} failed")

        return run

    commits = BackgroundCommits(ahead=5)
    for n in range(3):
        commits.submit(broken(n))
    hold.set()
    logged = caplog.at_level(logging.ERROR, logger="nightshift.running.committing")
    with logged, pytest.raises(StoreError, match="commit 0"):
        commits.drain()
    assert "commit 1" in caplog.text and "commit 2" in caplog.text
    commits.check()  # nothing stale is left to raise later
    commits.drain()


@pytest.fixture
def flow_spec(models, ticket_dir, tmp_path, write_spec):
    """120 tickets in 11 shards of up to 12, chunks of 5, on the fake engine."""
    data = spec_dict(models["chat"], ticket_dir, tmp_path / "out", plan={"shard_records": 12})
    data["run"] = {"engine": "fake", "chunk_records": 5, "canary": False, "retry_delay_s": [0]}
    return write_spec(data)


def input_ids(ticket_dir) -> list:
    import polars as pl

    return pl.read_parquet(ticket_dir / "*.parquet")["ticket_id"].to_list()


def test_the_engine_is_fed_while_a_finished_shard_commits(
    flow_spec, ticket_dir, tmp_path, monkeypatch
):
    """While the first shard's commit is held back (a slow bucket, a large Parquet), the
    engine goes on taking the next shards' records; every record is then committed once."""
    committing, fed_meanwhile = threading.Event(), threading.Event()
    take_window, commit = FakeEngine._take_window, ShardStore.commit

    def watched(self, pending):
        if committing.is_set():
            fed_meanwhile.set()
        return take_window(self, pending)

    def held(self, shard, *args, **kwargs):
        if shard == 0:
            committing.set()
            fed_meanwhile.wait(timeout=10)  # on the feeding thread: never set, 10 s lost
            committing.clear()
        return commit(self, shard, *args, **kwargs)

    monkeypatch.setattr(FakeEngine, "_take_window", watched)
    # an engine slower than the feed (as a GPU is for large shards): windows keep coming
    monkeypatch.setenv("NIGHTSHIFT_FAKE_SECONDS_PER_RECORD", "0.01")
    monkeypatch.setattr(ShardStore, "commit", held)

    report = job_flow(spec_path=str(flow_spec))

    assert fed_meanwhile.is_set()
    assert report["shards"]["committed"] == report["shards"]["count"] == 11
    assert_exactly_once(str(tmp_path / "out"), "ticket_id", input_ids(ticket_dir))


@pytest.mark.parametrize("broken", [3, 10])  # 10: the last shard, nothing fed after it
def test_a_commit_that_fails_fails_its_shard_and_a_rerun_loses_nothing(
    flow_spec, ticket_dir, tmp_path, monkeypatch, broken
):
    """The store failing a shard's commit fails that shard (named, with the store's
    error), not the run: the others commit, the flow ends instead of waiting on it, and
    a rerun commits it from its checkpoints."""
    commit = ShardStore.commit

    def failing(self, shard, *args, **kwargs):
        if shard == broken:
            raise StoreError(f"PUT results/shard-{shard:05d}: the bucket went away")
        return commit(self, shard, *args, **kwargs)

    monkeypatch.setattr(ShardStore, "commit", failing)
    outcome: list = []
    run = threading.Thread(target=lambda: outcome.append(_flow_error(flow_spec)), daemon=True)
    run.start()
    run.join(timeout=240)
    assert not run.is_alive(), "the flow waited on a shard whose commit had failed"
    assert "bucket went away" in str(outcome[0])
    out = str(tmp_path / "out")
    markers = JobOutput(out).shards.committed()
    assert sorted(markers) == [s for s in range(11) if s != broken]
    ids = committed_ids(out, "ticket_id")
    assert len(set(ids["results"] + ids["failed"])) == sum(
        m["records"]["planned"] for m in markers.values()
    )

    monkeypatch.setattr(ShardStore, "commit", commit)
    report = job_flow(spec_path=str(flow_spec))
    assert report["shards"]["committed"] == report["shards"]["count"]
    assert_exactly_once(out, "ticket_id", input_ids(ticket_dir))


def _flow_error(spec_path) -> BaseException | None:
    try:
        job_flow(spec_path=str(spec_path))
    except Exception as exc:  # noqa: BLE001 (the test reads it)
        return exc
    return None


def test_without_prefect_a_commit_that_failed_once_runs_again_in_place(
    flow_spec, ticket_dir, tmp_path, monkeypatch
):
    """``pipelines.direct`` retries in place: a shard whose commit failed once runs again
    from its checkpoints, as after an engine death, and the run ends whole."""
    from nightshift.jobs.loading import load_spec
    from nightshift.pipelines.direct import run_job

    commit, calls = ShardStore.commit, []

    def once(self, shard, *args, **kwargs):
        calls.append(shard)
        if calls.count(shard) == 1 and shard == 2:
            raise StoreError("PUT results/shard-00002: SlowDown")
        return commit(self, shard, *args, **kwargs)

    monkeypatch.setattr(ShardStore, "commit", once)
    log = tmp_path / "generated.log"
    monkeypatch.setenv("NIGHTSHIFT_FAKE_LOG", str(log))
    outcome = run_job(load_spec(flow_spec), progress=False)
    assert calls.count(2) == 2
    # the answers it held at the failed commit were checkpointed: none was asked again
    prompts = generated_prompts(log)
    assert prompts and len(prompts) == len(set(prompts))
    markers = JobOutput(str(tmp_path / "out")).shards.committed()
    assert sorted(markers) == list(range(11)) and markers[2]["attempts"] == 2
    assert_exactly_once(str(tmp_path / "out"), "ticket_id", input_ids(ticket_dir))
    assert outcome is not None


@pytest.mark.parametrize("runner", ["direct", "flow"])
def test_a_commit_that_failed_after_its_marker_keeps_the_shard_committed(
    flow_spec, ticket_dir, tmp_path, monkeypatch, runner
):
    """The store took the marker but the call failed after it (a response lost on the
    way back): the shard is committed, its files stay whole, and no retry writes over
    them or deletes them."""
    from nightshift.jobs.loading import load_spec
    from nightshift.pipelines.direct import run_job

    commit, calls = ShardStore.commit, []

    def lost_reply(self, shard, *args, **kwargs):
        calls.append(shard)
        won = commit(self, shard, *args, **kwargs)
        if shard == 4 and calls.count(4) == 1:
            raise StoreError("PUT committed/shard-00004.json: connection reset")
        return won

    monkeypatch.setattr(ShardStore, "commit", lost_reply)
    if runner == "direct":
        run_job(load_spec(flow_spec), progress=False)
    else:
        job_flow(spec_path=str(flow_spec))
    out = str(tmp_path / "out")
    markers = JobOutput(out).shards.committed()
    assert sorted(markers) == list(range(11)) and calls.count(4) == 1
    for f in markers[4]["files"]:
        data = (tmp_path / "out" / f["key"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"]
    assert_exactly_once(out, "ticket_id", input_ids(ticket_dir))


def test_a_loser_s_commit_never_deletes_a_file_the_winner_s_marker_names(tmp_path):
    """Two commits of one shard under one attempt's keys (a retry in the same run): the
    second loses the marker and must not delete the files the first's marker names."""
    import pyarrow as pa

    from nightshift.io.objectstore import LocalStore

    shards = ShardStore(LocalStore(tmp_path))
    table = pa.table({"ticket_id": ["a", "b"]})
    summary = {"records": {"planned": 2, "ok": 2, "failed": 0}}
    assert shards.commit(0, "a1", {"ok": table}, summary)
    assert not shards.commit(0, "a1", {"ok": table}, summary)
    for f in shards.committed()[0]["files"]:
        assert (tmp_path / f["key"]).exists()


class _Tables:
    """The two row builders a shard's merge needs (``running.results.ResultTables``)."""

    ok_schema = pa.schema(
        [
            ("id", pa.string()),
            ("embedding", pa.list_(pa.float32())),
            ("finish_reason", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("cached_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
        ]
    )
    failed_schema = pa.schema(
        [("id", pa.string()), ("error", pa.string()), ("finish_reason", pa.string())]
        + [(c, pa.int64()) for c in ("prompt_tokens", "cached_tokens", "output_tokens")]
    )

    def results_table(self, rows: list[dict]) -> pa.Table:
        return pa.Table.from_pylist(rows, schema=self.ok_schema)

    def failed_table(self, rows: list[dict]) -> pa.Table:
        return pa.Table.from_pylist(rows, schema=self.failed_schema)


def _ok(i: int, tokens: int = 3) -> dict:
    return {
        "id": f"r{i}", "embedding": [i / 10, 1.0], "finish_reason": "stop",
        "prompt_tokens": tokens, "cached_tokens": 0, "output_tokens": 0,
    }  # fmt: skip


def _failed(i: int) -> dict:
    return {
        "id": f"r{i}", "error": "engine: boom", "finish_reason": None,
        "prompt_tokens": 5, "cached_tokens": 0, "output_tokens": 0,
    }  # fmt: skip


def test_a_commit_writes_the_ok_rows_a_chunk_at_a_time_one_row_per_record(tmp_path):
    """The merge reads the ok chunks' keys, then the commit reads each chunk again as
    it writes it (``parquetfiles.write_parts``): never the shard's rows whole.
    What is written is what merging every row at once gave: the first row of each id,
    in order, an ok answer winning over a failure, and the marker's sums over those."""
    from nightshift.running.shardwork import ShardWork, shard_summary

    tables, shards = _Tables(), ShardStore(LocalStore(tmp_path))
    chunks = [
        ([_ok(0), _ok(1), _ok(2)], [_failed(3)]),
        ([_ok(1, tokens=99), _ok(4)], []),  # r1 again: an attempt beside this one had it
        ([_ok(3), _ok(5)], [_failed(6)]),  # r3 answered after all
        ([_ok(0, tokens=99)], []),  # nothing new: every row of it came first elsewhere
    ]
    files = []
    for index, (ok, failed) in enumerate(chunks):
        written = {"ok": tables.results_table(ok), "failed": tables.failed_table(failed)}
        files += shards.write_chunk(0, "a1", index, written)
    work = ShardWork(shard=0, planned=9, files=files, ok=[_ok(7), _ok(8)], failed=[])
    reads = []
    read = shards.read
    shards.read = lambda files, kind: reads.append(kind) or read(files, kind)

    merged = work.merged(shards, tables, "id")
    summary = shard_summary(merged.ok, merged.failed, 9, 1)
    assert reads.count("ok") == 4  # the keys: each ok chunk once
    assert shards.commit(0, "a1", {"ok": merged.ok_parts(), "failed": merged.failed}, summary)
    assert reads.count("ok") == 8  # and once more as it is written

    (ok_file,) = [f for f in shards.committed()[0]["files"] if f["kind"] == "ok"]
    written = pq.ParquetFile(tmp_path / ok_file["key"])
    assert written.num_row_groups == 1  # small chunks gathered into one row group
    rows = written.read().to_pylist()
    assert [r["id"] for r in rows] == [f"r{i}" for i in (0, 1, 2, 4, 3, 5, 7, 8)]
    assert rows[1]["prompt_tokens"] == 3  # r1's first row, not the 99 of its second
    assert rows[4]["embedding"] == pytest.approx([0.3, 1.0])
    assert merged.failed.column("id").to_pylist() == ["r6"]
    assert summary["records"] == {"planned": 9, "ok": 8, "failed": 1}
    assert summary["tokens"]["prompt"] == 8 * 3 + 5
    assert ok_file["rows"] == 8
    assert ok_file["sha256"] == hashlib.sha256((tmp_path / ok_file["key"]).read_bytes()).hexdigest()
