"""A finished shard commits on a thread of its own (``running.committing``): the engine
is fed meanwhile, commits keep their order and bound, and a commit that fails stops the
run with its error and loses nothing."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.errors import StoreError
from nightshift.io.outputs import JobOutput
from nightshift.io.shardstore import ShardStore
from nightshift.pipelines.flow import job_flow
from nightshift.running.committing import BackgroundCommits

from .conftest import spec_dict
from .durable import assert_exactly_once, committed_ids


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
    third = threading.Thread(target=commits.submit, args=(commit(2),))
    third.start()
    time.sleep(0.3)
    assert third.is_alive()  # the feeding thread waits: two finished shards held already
    release.set()
    third.join(timeout=10)
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


@pytest.fixture
def flow_spec(models, ticket_dir, tmp_path, write_spec):
    """120 tickets in 11 shards of up to 12, chunks of 5, on the fake engine."""
    data = spec_dict(models["chat"], ticket_dir, tmp_path / "out", plan={"shard_records": 12})
    data["run"] = {"engine": "fake", "chunk_records": 5}
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


def test_a_commit_that_fails_stops_the_run_with_its_error_and_a_rerun_loses_nothing(
    flow_spec, ticket_dir, tmp_path, monkeypatch
):
    commit = ShardStore.commit

    def failing(self, shard, *args, **kwargs):
        if shard == 3:
            raise StoreError("PUT results/shard-00003: the bucket went away")
        return commit(self, shard, *args, **kwargs)

    monkeypatch.setattr(ShardStore, "commit", failing)
    with pytest.raises(Exception, match="bucket went away"):
        job_flow(spec_path=str(flow_spec))
    out = str(tmp_path / "out")
    markers = JobOutput(out).shards.committed()
    assert 0 in markers and 3 not in markers  # shards before it committed; not shard 3
    ids = committed_ids(out, "ticket_id")
    assert len(set(ids["results"] + ids["failed"])) == sum(
        m["records"]["planned"] for m in markers.values()
    )

    monkeypatch.setattr(ShardStore, "commit", commit)
    report = job_flow(spec_path=str(flow_spec))
    assert report["shards"]["committed"] == report["shards"]["count"]
    assert_exactly_once(out, "ticket_id", input_ids(ticket_dir))
