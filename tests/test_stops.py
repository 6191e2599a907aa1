"""Hangs and stops: the stall watchdog (run.stall_s), a graceful stop on SIGTERM and on a
Prefect cancellation (run.stop_s, exit code 3), and a stopped worker's released lease."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import polars as pl
import psutil
import pytest

from nightshift.io.outputs import JobOutput

from .conftest import spec_dict
from .durable import NIGHTSHIFT, assert_exactly_once, committed_ids, report

STOPPED = 3


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_stall_watch_trips_on_silence_only_while_the_engine_steps():
    from nightshift.engines.vllm_engine import StallWatch

    clock, tokens = Clock(), [0]
    watch = StallWatch(10.0, lambda: tokens[0], clock)
    # A slow but healthy engine: one step of 30 s (a long prefill), tokens moving, no
    # request finished: never a stall.
    watch.begin_step()
    for _ in range(30):
        clock.now += 1
        tokens[0] += 1
        assert not watch.stalled()
    watch.end_step()
    # Time the caller spends outside the engine (writing a checkpoint) is not silence.
    clock.now += 100
    assert not watch.stalled()
    # A step that never returns, no token: a stall once 10 s of it passed unchanged.
    watch.begin_step()
    tripped = None
    for second in range(1, 40):
        clock.now += 1
        if watch.stalled():
            tripped = second
            break
    assert tripped is not None and 10 <= tripped <= 16
    # A finished request is progress even when the counter is unavailable.
    watch = StallWatch(10.0, lambda: None, clock)
    watch.begin_step()
    for _ in range(30):
        clock.now += 1
        watch.finished += 1
        assert not watch.stalled()


def test_a_hung_engine_is_replaced_and_the_report_says_so(models, ticket_dir, tmp_path):
    """The fake engine hangs once mid-shard; its stall watch ends the hang, the shard
    continues from its checkpoints, every id once, and the report counts the stall."""
    from nightshift.engines.fake import FakeEngine
    from nightshift.jobs.loading import validate_spec
    from nightshift.pipelines.direct import run_job

    out = tmp_path / "out"
    spec = spec_dict(models["chat"], ticket_dir, out, plan={"shard_records": 40})
    spec["run"] = {"engine": "fake", "chunk_records": 8}
    engine = FakeEngine(hang_after=50, stall_s=0.3)
    outcome = run_job(validate_spec(spec), engine=engine, progress=False)
    assert engine.stalls == 1
    assert outcome.report["this_run"]["engine_stalls"] == 1
    assert outcome.report["shards"]["complete"]
    assert_exactly_once(str(out), "ticket_id", pl.read_parquet(ticket_dir)["ticket_id"].to_list())
    assert "hung 1 time(s)" in (out / "report.md").read_text()


def start(spec_path: Path, *args: str, env: dict | None = None, command=("run",)):
    limit = {"NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}"}
    return subprocess.Popen(
        [*NIGHTSHIFT, "jobs", *command, str(spec_path), *args],
        env={**os.environ, **limit, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(
    condition, process: subprocess.Popen, timeout: float = 300, every: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


def checkpointed(out: Path) -> bool:
    """Some shard has a checkpointed chunk and none is committed yet... or later."""
    output = JobOutput(str(out))
    manifest = output.plans.manifest()
    if manifest is None:
        return False
    return any(output.shards.checkpoint(s["index"]) for s in manifest["shards"]["each"])


def stop_within(process: subprocess.Popen, stop_s: float, how=signal.SIGTERM) -> float:
    began = time.monotonic()
    process.send_signal(how)
    try:
        process.communicate(timeout=stop_s + 5)
    finally:
        if process.poll() is None:
            for p in [*psutil.Process(process.pid).children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            process.kill()
    return time.monotonic() - began


def assert_answered_once_in_two_runs(out: Path, ticket_dir: Path, first: dict, second: dict):
    ids = pl.read_parquet(ticket_dir)["ticket_id"].to_list()
    answered = first["this_run"]["records_answered"] + second["this_run"]["records_answered"]
    assert answered == len(ids)  # nothing answered twice, nothing lost
    assert_exactly_once(str(out), "ticket_id", ids)
    assert committed_ids(str(out), "ticket_id")["failed"] == []  # no aborted row


def fake_job(models, ticket_dir, out, write_spec, **run) -> Path:
    data = spec_dict(models["chat"], ticket_dir, out, plan={"shard_records": 40})
    data["name"] = f"stop-{uuid.uuid4().hex[:6]}"
    data["run"] = {"engine": "fake", "chunk_records": 8, "stop_s": 20, **run}
    return write_spec(data, f"{data['name']}.yaml")


SLOW = {"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.05"}


def test_sigterm_stops_gracefully_and_the_rerun_answers_the_rest(
    models, ticket_dir, tmp_path, write_spec
):
    out = tmp_path / "out"
    spec = fake_job(models, ticket_dir, out, write_spec)
    run = start(spec, "-q", env=SLOW)
    wait_for(lambda: checkpointed(out), run)
    took = stop_within(run, 20)
    assert run.returncode == STOPPED, run.stderr
    assert took < 20
    first = report(str(out))
    assert first["stopped"]["signal"] == "SIGTERM"
    assert not first["shards"]["complete"]
    assert "**Stopped** (SIGTERM)" in (out / "report.md").read_text()

    again = start(spec, "-q")
    again.communicate(timeout=300)
    assert again.returncode == 0, again.stderr
    assert_answered_once_in_two_runs(out, ticket_dir, first, report(str(out)))


def test_a_prefect_cancellation_stops_the_run_gracefully(
    models, ticket_dir, tmp_path, write_spec, prefect_server
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.objects import State, StateType

    out = tmp_path / "out"
    spec = fake_job(models, ticket_dir, out, write_spec)
    name = spec.stem
    run = start(spec, "-q", env=SLOW)
    wait_for(lambda: checkpointed(out), run)
    with get_client(sync_client=True) as client:
        [flow_run] = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"{name}-"))
        )
        client.set_flow_run_state(flow_run.id, State(type=StateType.CANCELLING))
        run.communicate(timeout=60)
        assert run.returncode == STOPPED, run.stderr
        assert client.read_flow_run(flow_run.id).state.type == StateType.CANCELLED
    first = report(str(out))
    assert first["stopped"]["signal"] == "cancelled"
    again = start(spec, "-q")
    again.communicate(timeout=300)
    assert again.returncode == 0, again.stderr
    assert_answered_once_in_two_runs(out, ticket_dir, first, report(str(out)))


def test_a_worker_stopped_while_holding_a_lease_releases_it(
    models, ticket_dir, tmp_path, write_spec
):
    from nightshift.io.leases import ShardLeases
    from nightshift.jobs.loading import load_spec
    from nightshift.scheduling.dryrun import plan_summary

    out = tmp_path / "out"
    spec = fake_job(models, ticket_dir, out, write_spec, lease_s=600)
    plan_summary(load_spec(spec), write=True)
    worker = start(spec, "--worker", "w", env=SLOW, command=("work",))
    wait_for(lambda: checkpointed(out), worker)
    output = JobOutput(str(out))
    shards = [s["index"] for s in output.plans.manifest()["shards"]["each"]]
    observer = ShardLeases(output.store, "observer")
    held = [s for s in shards if (observer.holder(s) or {}).get("worker", "").startswith("w-")]
    assert held
    stop_within(worker, 20)
    assert worker.returncode == STOPPED, worker.stderr
    committed = output.shards.committed()
    for shard in held:
        if shard not in committed:  # released, not left to expire in 600 s
            assert observer.holder(shard)["released"]
            assert ShardLeases(output.store, "next-worker", ttl_s=600).claim(shard)


@pytest.mark.engine
def test_a_frozen_engine_core_is_killed_and_replaced_and_the_job_completes(
    models, ticket_dir, tmp_path, monkeypatch
):
    """Real vLLM: the engine-core process is SIGSTOPped right after the first checkpoint
    (not the first commit: a fast machine had every record answered by then, and nothing
    stalled); within run.stall_s the watchdog kills it with its children, the shards in
    flight go on from their checkpoints on a fresh engine, and every id is answered once."""
    from nightshift.io.shardstore import ShardStore
    from nightshift.jobs.loading import validate_spec
    from nightshift.pipelines.direct import run_job

    write_chunk, frozen = ShardStore.write_chunk, []

    def checkpoint_then_freeze(self, shard, *args, **kwargs):
        done = write_chunk(self, shard, *args, **kwargs)
        for child in [] if frozen else psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                    os.kill(child.pid, signal.SIGSTOP)
                    frozen.append(child)
        return done

    monkeypatch.setattr(ShardStore, "write_chunk", checkpoint_then_freeze)
    monkeypatch.setenv("NIGHTSHIFT_GPU_LIMIT", f"test-gpu-{uuid.uuid4().hex[:8]}")
    out = tmp_path / "out"
    data = spec_dict(models["chat"], ticket_dir, out, plan={"shard_records": 40})
    data["run"] = {"chunk_records": 8, "stall_s": 5, "canary": False}
    # Small batches: most records are still to run at the first checkpoint.
    data["engine"] = {"max_num_seqs": 8, "extra": {"enforce_eager": True}}
    outcome = run_job(validate_spec(data), progress=False)

    assert frozen
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in frozen)
    run = outcome.report["this_run"]
    assert run["engine_stalls"] == 1 and run["engine_starts"] == 2
    assert outcome.report["shards"]["complete"]
    ids = pl.read_parquet(ticket_dir)["ticket_id"].to_list()
    assert_exactly_once(str(out), "ticket_id", ids)
    assert committed_ids(str(out), "ticket_id")["failed"] == []


@pytest.mark.engine
def test_sigterm_to_a_real_engine_run_mid_shard_keeps_every_answer_once(
    models, ticket_dir, tmp_path, write_spec
):
    """Real vLLM: SIGTERM mid-shard exits 3 within run.stop_s, the report says stopped,
    no aborted request became a row; the rerun on the same engine answers exactly the
    rest (another engine is refused: its answers would differ)."""
    out = tmp_path / "out"
    # One shard of 120 open-ended answers (the random model rarely says EOS) in chunks of 4:
    # a checkpoint stands for nearly the whole run, so a fast machine cannot finish the job
    # between two looks (CI once answered 3 shards of one-token labels inside one poll).
    data = spec_dict(
        models["chat"],
        ticket_dir,
        out,
        plan={"shard_records": 120},
        task={"kind": "generate"},
        sampling={"max_tokens": 48},
    )
    data["run"] = {"chunk_records": 4, "stop_s": 60, "canary": False}
    spec = write_spec(data)
    run = start(spec, "-q")
    wait_for(lambda: checkpointed(out), run, timeout=600, every=0.05)
    took = stop_within(run, 60)
    assert run.returncode == STOPPED, run.stderr
    assert took < 60
    first = report(str(out))
    assert first["stopped"]["signal"] == "SIGTERM"
    other = start(spec, "-q", "--set", "run.engine=fake")
    assert other.communicate(timeout=300) and other.returncode == 2  # not its engine
    again = start(spec, "-q")
    again.communicate(timeout=600)
    assert again.returncode == 0, again.stderr
    assert_answered_once_in_two_runs(out, ticket_dir, first, report(str(out)))
