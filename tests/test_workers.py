"""Scale-out: `jobs run --workers N`, workers claiming shards through leases on one
output, a worker killed mid-shard, and the figures the report adds up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
import yaml

from nightshift.io.outputs import JobOutput

from .conftest import spec_dict, write_records
from .durable import assert_exactly_once, report

pytest_plugins = ["tests.s3server"]


def tickets(n: int) -> list[dict]:
    return [
        {
            "ticket_id": f"t{i:03d}",
            "subject": f"subject {i % 7}",
            "body": f"body {i} " * (1 + i % 9),
        }
        for i in range(n)
    ]


def start_run(spec_path, workers: int, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nightshift.cli",
            "jobs",
            "run",
            str(spec_path),
            "-q",
            "--workers",
            str(workers),
        ],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker_processes(run: subprocess.Popen) -> dict[str, psutil.Process]:
    """The run's worker processes by worker name (worker-0, ...)."""
    found = {}
    for child in psutil.Process(run.pid).children(recursive=True):
        try:
            line = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "work" in line and "--worker" in line:
            found[line[line.index("--worker") + 1]] = child
    return found


def kill_with_children(process: psutil.Process) -> None:
    """SIGKILL a worker and its engine processes, as if its machine died."""
    for p in [*process.children(recursive=True), process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)


def held_shards(location: str, worker: str) -> list[int]:
    """Shards whose newest lease names ``worker`` and that have not committed."""
    from nightshift.io.leases import ShardLeases

    output = JobOutput(location)
    committed = output.shards.committed()
    leases = ShardLeases(output.store, "observer")
    shards = [s["index"] for s in output.plans.manifest()["shards"]["each"]]
    return [
        s
        for s in shards
        if s not in committed and (leases.holder(s) or {}).get("worker", "").startswith(worker)
    ]


def test_two_local_workers_share_the_shards_on_the_fake_engine(models, tmp_path, write_spec):
    rows = tickets(120)
    write_records(tmp_path / "in" / "a.parquet", rows)
    out = tmp_path / "out"
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        out,
        plan={"shard_records": 10},
        run={"engine": "fake", "chunk_records": 4},
    )
    # 6 s of answers: on a loaded machine one worker must not finish them all before
    # the other's engine has started
    run = start_run(write_spec(spec), 2, {"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.05"})
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr
    assert_exactly_once(str(out), "ticket_id", [r["ticket_id"] for r in rows])
    figures = report(str(out))
    assert figures["shards"]["complete"] and figures["shards"]["count"] >= 8
    assert figures["this_run"]["engine_starts"] == 2
    assert len(figures["timeline"]["engine_startups"]) == 2  # each worker's, on one clock
    assert figures["this_run"]["records_answered"] == 120
    assert figures["timeline"]["samples"][-1]["records"] == 120
    assert figures["tail_s"] is not None and figures["tail_s"] >= 0
    workers = JobOutput(str(out)).store.list("_work/workers/")
    assert len(workers) == 2  # both took part


@pytest.mark.engine
@pytest.mark.engine_all_cores  # --workers binds each worker's engine to its own cores
def test_two_workers_on_s3_survive_a_worker_killed_mid_shard(models, tmp_path, s3_env):
    """Real vLLM, S3 output, 2 workers, 24 shards: kill worker-1 (and its engine) while
    it holds a shard; its lease expires, worker-0 takes the shard over, and every record
    is in the output exactly once. Two workers, not three: on two cores a third engine
    would share a core with another, and both crawl."""
    rows = tickets(144)
    write_records(tmp_path / "in" / "a.parquet", rows)
    out = f"s3://{s3_env.bucket}/jobs/{uuid.uuid4().hex[:8]}/out"
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        out,
        plan={"shard_records": 6},
        run={"chunk_records": 2, "lease_s": 15},
    )
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    run = start_run(spec_path, 2, s3_env.env())
    try:
        victim = _kill_worker_holding_a_shard(run, out, "worker-1")
        stdout, stderr = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            kill_with_children(psutil.Process(run.pid))
    assert run.returncode == 0, stderr
    assert_exactly_once(out, "ticket_id", [r["ticket_id"] for r in rows])
    figures = report(out)
    assert figures["shards"]["count"] >= 20 and figures["shards"]["complete"]
    assert victim in JobOutput(out).shards.committed()  # taken over and finished
    assert figures["this_run"]["engine_starts"] >= 1  # the survivor's engine


def _kill_worker_holding_a_shard(run, out: str, name: str, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[1]
        worker = worker_processes(run).get(name)
        held = held_shards(out, name) if worker and JobOutput(out).plans.manifest() else []
        if held:
            kill_with_children(worker)
            return held[0]
        time.sleep(0.5)
    raise AssertionError(f"{name} never held a shard")


def test_a_worker_takes_over_a_shard_once_a_dead_workers_lease_expires(
    models, tmp_path, write_spec
):
    """A lease left by a worker that died blocks its shard only until it expires; a live
    worker (`nightshift jobs work`) then takes it over and finishes the job."""
    from nightshift.io.leases import ShardLeases
    from nightshift.jobs.loading import validate_spec
    from nightshift.scheduling.dryrun import plan_summary

    rows = tickets(60)
    write_records(tmp_path / "in" / "a.parquet", rows)
    out = tmp_path / "out"
    data = spec_dict(
        models["chat"], tmp_path / "in", out, plan={"shard_records": 10}, run={"engine": "fake"}
    )
    plan_summary(validate_spec(data), write=True)
    output = JobOutput(str(out))
    assert ShardLeases(output.store, "dead-worker", ttl_s=30).claim(0) is not None

    work = subprocess.run(
        [sys.executable, "-m", "nightshift.cli", "jobs", "work", str(write_spec(data))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert work.returncode == 0, work.stderr
    assert_exactly_once(str(out), "ticket_id", [r["ticket_id"] for r in rows])
    [figures] = [json.loads(output.store.get_bytes(k)) for k in output.store.list("_work/workers/")]
    assert 0 in figures["committed"]  # taken over from the dead worker
    assert figures["committed"][-1] == 0  # after every shard that was free


def _worker_reads(models, tmp_path, shards: int) -> int:
    """Store reads (GETs: reads of whole objects and downloads) of one in-process worker
    running a planned job of ``shards`` shards to the end on the fake engine."""
    from prefect import flow

    from nightshift.engines.fake import FakeEngine
    from nightshift.io.leases import ShardLeases
    from nightshift.io.objectstore import LocalStore
    from nightshift.jobs.loading import validate_spec
    from nightshift.pipelines.workers import claim_and_run
    from nightshift.running.engines import EnginePool
    from nightshift.running.feeding import FeedingLoop
    from nightshift.running.runner import start_run as take_up_plan
    from nightshift.scheduling.dryrun import plan_summary

    root = tmp_path / f"n{shards}"
    rows = [  # distinct prompts: exact repeats would be answered once (dedup)
        {"ticket_id": f"t{i:03d}", "subject": "s", "body": f"body {i}"} for i in range(4 * shards)
    ]
    write_records(root / "in" / "a.parquet", rows)
    data = spec_dict(
        models["chat"], root / "in", root / "out", plan={"shard_records": 4}, run={"engine": "fake"}
    )
    spec = validate_spec(data)
    plan_summary(spec, write=True)
    job = take_up_plan(spec, progress=False, retry_in_place=False, as_worker=True)
    assert len(job.todo) == shards
    leases = ShardLeases(job.output.store, "counted-worker")
    engines = EnginePool(spec, FakeEngine())
    reads = 0
    get_bytes, download = LocalStore.get_bytes, LocalStore.download

    def counted(method):
        def read(self, *args, **kwargs):
            nonlocal reads
            reads += 1
            return method(self, *args, **kwargs)

        return read

    feeding = FeedingLoop(job.runner, engines)

    @flow(name="counted-worker")
    def counted_worker() -> list[int]:  # shard tasks are submitted from a flow
        return claim_and_run(job, feeding, leases)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalStore, "get_bytes", counted(get_bytes))
        patch.setattr(LocalStore, "download", counted(download))
        done = counted_worker()
    feeding.close()
    engines.close()
    assert sorted(done) == sorted(job.todo)
    assert_exactly_once(str(root / "out"), "ticket_id", [r["ticket_id"] for r in rows])
    return reads


@pytest.mark.filterwarnings("ignore:Logger 'prefect.task_runs' attempted")  # tasks sans flow
def test_a_workers_store_reads_grow_with_its_shards_not_their_square(models, tmp_path):
    """A worker reads the claimed shard's own marker, never every marker per shard (on S3
    that was O(shards²) GETs: about 32M per worker for 4,000 shards)."""
    small, large = _worker_reads(models, tmp_path, 8), _worker_reads(models, tmp_path, 16)
    assert small <= 8 * 8 and large <= 8 * 16
    assert large <= 2.25 * small
