"""Jobs as Prefect flows, against the session's real local Prefect server (conftest):
shard tasks, retries, resume, artifacts, the GPU slot, incremental nights, schedules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import polars as pl
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
)

from nightshift.io.outputs import JobOutput
from nightshift.pipelines.flow import job_flow

from .conftest import spec_dict, tickets, write_records
from .durable import assert_exactly_once


def run_flow(spec_path: Path, **options):
    """Run the job flow in-process; return (report, flow run id)."""
    state = job_flow(spec_path=str(spec_path), return_state=True, **options)
    return state.result(), state.state_details.flow_run_id


def task_runs(flow_run_id) -> dict[str, object]:
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {run.name: run for run in runs}


def artifacts(flow_run_id) -> dict[str, object]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.type: a for a in found}


def fake_spec(write_spec, ticket_dir: Path, out: Path, models, **sections) -> Path:
    data = spec_dict(models["chat"], ticket_dir, out, plan={"shard_records": 40}, **sections)
    data["run"] = {"engine": "fake", "chunk_records": 8, **data.get("run", {})}
    return write_spec(data, f"{uuid.uuid4().hex[:6]}.yaml")


@pytest.mark.engine
def test_the_flow_retries_a_shard_whose_engine_died_resumes_and_publishes_the_report(
    models, ticket_dir, tmp_path, write_spec, monkeypatch
):
    """Real vLLM: the engine-core process is SIGKILLed at shard 0's first checkpoint
    (small batches: shards 1 and 2 have not started); shard 0's task fails, Prefect
    retries it on a fresh engine, shards 1 and 2 go on there, and the flow completes
    with the output exact. A second run of the flow skips every shard and starts no
    engine."""
    import psutil

    from nightshift.io.shardstore import ShardStore

    write_chunk = ShardStore.write_chunk

    def checkpoint_then_kill_the_engine(self, shard, *args, **kwargs):
        done = write_chunk(self, shard, *args, **kwargs)
        if shard == 0 and not killed:
            killed.append(shard)
            for child in psutil.Process().children(recursive=True):
                if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                    os.kill(child.pid, signal.SIGKILL)
        return done

    killed: list[int] = []
    monkeypatch.setattr(ShardStore, "write_chunk", checkpoint_then_kill_the_engine)
    monkeypatch.setenv("NIGHTSHIFT_REPORT_CHART", "1")  # the suite's runs draw none
    monkeypatch.setenv("NIGHTSHIFT_GPU_LIMIT", f"test-gpu-{uuid.uuid4().hex[:8]}")
    out = tmp_path / "out"
    data = spec_dict(models["chat"], ticket_dir, out, plan={"shard_records": 40})
    data["run"] = {"chunk_records": 8, "retry_delay_s": [1], "canary": False}
    # Small batches: shard 1's records are not yet in the engine when shard 0 checkpoints.
    data["engine"] = {"max_num_seqs": 8, "extra": {"enforce_eager": True}}
    spec_path = write_spec(data)

    report, flow_run_id = run_flow(spec_path)
    assert killed == [0]

    assert report["shards"] == {"count": 3, "committed": 3, "failed": {}, "complete": True}
    assert report["this_run"]["engine_starts"] == 2
    assert_exactly_once(str(out), "ticket_id", pl.read_parquet(ticket_dir)["ticket_id"].to_list())
    runs = task_runs(flow_run_id)
    assert {"plan", "shard-0", "shard-1", "shard-2", "report"} <= set(runs)
    assert runs["shard-0"].run_count == 2  # failed once, retried by Prefect
    assert runs["shard-1"].run_count == runs["shard-2"].run_count == 1
    assert all(r.state.is_completed() for r in runs.values())
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).name.startswith("test-job-")

    published = artifacts(flow_run_id)
    cost = report["cost"]
    page = published["markdown"].data
    assert f"{report['tokens']['prompt']:,}" in page
    assert f"{cost['usd_per_gpu_hour']:.2f} x 1 x" in page  # the formula, worked out
    rows = {r["metric"]: r for r in json.loads(published["table"].data)}
    assert rows["prompt tokens (in)"]["value"] == f"{report['tokens']['prompt']:,}"
    assert (out / "report.md").read_text().startswith("# test-job")
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["timeline"]["samples"][-1]["records"] == report["this_run"]["records_answered"]
    assert sorted(t["shard"] for t in report["shard_times"]) == [0, 1, 2]

    again, again_id = run_flow(spec_path)
    assert again["this_run"]["shards_committed"] == []
    assert again["this_run"]["engine_starts"] == 0
    assert not [name for name in task_runs(again_id) if name.startswith("shard-")]
    assert again["records"] == report["records"]


def test_a_night_with_new_records_generates_only_those(
    models, ticket_dir, tmp_path, write_spec, monkeypatch
):
    """Run, add records (one of them reusing an id already done), run again: only the
    new ids are generated, and every id is in the output once."""
    log = tmp_path / "engine.log"
    monkeypatch.setenv("NIGHTSHIFT_FAKE_LOG", str(log))
    monkeypatch.setenv("NIGHTSHIFT_GPU_LIMIT", f"test-gpu-{uuid.uuid4().hex[:8]}")
    out = tmp_path / "out"
    spec_path = fake_spec(write_spec, ticket_dir, out, models)
    first, _ = run_flow(spec_path)
    assert first["records"]["ok"] + first["records"]["failed"] == 120
    first_generated = len(log.read_text().split())

    old_ids = pl.read_parquet(ticket_dir)["ticket_id"].to_list()
    new = [{**t, "ticket_id": f"night2-{i}"} for i, t in enumerate(list(tickets(30, seed=9)))]
    again = {**next(iter(tickets(1, seed=10))), "ticket_id": old_ids[5]}  # already answered
    write_records(ticket_dir / "part-3.parquet", [{**t, "body": t["body"][:1500]} for t in new])
    write_records(ticket_dir / "part-4.parquet", [{**again, "body": again["body"][:1500]}])

    second, _ = run_flow(spec_path)
    assert len(log.read_text().split()) - first_generated == 30
    assert second["this_run"]["records_answered"] == 30
    assert second["shards"]["complete"]
    assert second["records"]["input"] == 150
    assert_exactly_once(str(out), "ticket_id", old_ids + [t["ticket_id"] for t in new])
    manifest = JobOutput(str(out)).plans.manifest()
    assert [i["records"] for i in manifest["increments"]] == [120, 30]
    # The new shards are numbered after the first night's.
    assert min(manifest["increments"][1]["shards"]) == first["shards"]["count"]

    third, _ = run_flow(spec_path)  # nothing new: nothing planned, nothing generated
    assert third["this_run"]["records_answered"] == 0
    assert len(JobOutput(str(out)).plans.manifest()["increments"]) == 2


def test_shards_wait_for_the_gpu_slot_another_run_holds(
    models, ticket_dir, tmp_path, write_spec, monkeypatch
):
    """While the host's GPU limit is full, the flow's shards queue; they run once the
    slot is free."""
    from prefect.concurrency.sync import concurrency

    from nightshift.pipelines.slots import ensure_limit

    name = f"test-gpu-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("NIGHTSHIFT_GPU_LIMIT", name)
    ensure_limit(name, 1)
    out = tmp_path / "out"
    spec_path = fake_spec(write_spec, ticket_dir, out, models)
    results = {}
    with concurrency(name, occupy=1, strict=True):
        runner = threading.Thread(target=lambda: results.update(report=run_flow(spec_path)[0]))
        runner.start()
        deadline = time.monotonic() + 120
        while JobOutput(str(out)).plans.manifest() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(5)  # planned; now the flow waits for the slot instead of generating
        assert runner.is_alive()
        assert JobOutput(str(out)).shards.committed() == {}
    runner.join(timeout=120)
    assert results["report"]["shards"]["complete"]


def test_serve_creates_one_deployment_per_scheduled_spec(models, tmp_path, prefect_server):
    """`nightshift schedule serve` registers each scheduled spec with its cron and time
    zone (read back from the server's API; the clock is not waited for)."""
    nightly = tmp_path / "nightly"
    nightly.mkdir()
    job = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out")
    scheduled = {
        **job,
        "name": "nightly-a",
        "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
    }
    (nightly / "a.yaml").write_text(yaml.safe_dump(scheduled))
    (nightly / "b.yaml").write_text(yaml.safe_dump({**job, "name": "unscheduled"}))
    serve = subprocess.Popen(
        [sys.executable, "-m", "nightshift.cli", "schedule", "serve", str(nightly)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deployment = _wait_for_deployment("nightshift-job/nightly-a", serve)
    finally:
        serve.send_signal(signal.SIGTERM)
        output = serve.communicate(timeout=60)[0]
    cron = deployment.schedules[0].schedule
    assert (cron.cron, cron.timezone) == ("0 2 * * *", "Europe/Berlin")
    assert deployment.parameters == {"spec_path": str((nightly / "a.yaml").resolve())}
    with get_client(sync_client=True) as client:
        names = [d.name for d in client.read_deployments()]
    assert "unscheduled" not in names, output


def test_deploy_registers_the_specs_with_a_work_pool(models, tmp_path):
    from prefect.client.schemas.actions import WorkPoolCreate

    from nightshift.pipelines.schedules import deploy_specs

    pool = f"gpu-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    job = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out")
    job.update(name="nightly-b", schedule={"cron": "30 1 * * 1-5"})
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(job))

    assert deploy_specs(tmp_path, pool) == ["nightshift-job/nightly-b"]
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("nightshift-job/nightly-b")
    assert deployment.work_pool_name == pool
    assert deployment.entrypoint == "nightshift.pipelines.flow.job_flow"
    assert deployment.schedules[0].schedule.cron == "30 1 * * 1-5"
    assert deployment.schedules[0].schedule.timezone == "UTC"


def test_a_cron_prefect_refuses_names_the_key(models, tmp_path):
    from typer.testing import CliRunner

    from nightshift.cli import app

    job = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out")
    job["schedule"] = {"cron": "61 2 * * *"}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(job))
    result = CliRunner().invoke(app, ["schedule", "deploy", str(tmp_path), "--pool", "x"])
    assert result.exit_code == 2
    assert "schedule.cron" in result.output


def _wait_for_deployment(name: str, serve: subprocess.Popen, timeout: float = 120):
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            assert serve.poll() is None, serve.communicate()[0]
            try:
                return client.read_deployment_by_name(name)
            except ObjectNotFound:
                time.sleep(1)
    raise AssertionError(f"{name} was not served within {timeout} s")


def test_the_live_projection_on_a_hand_computed_case():
    """20 of 100 records answered in the 20 s since the first answer, 30 s into the run:
    1 record/s, so 80 s left; cost = $2 x 2 GPUs x (30 + 80) s / 3600."""
    from nightshift.jobs.spec import CostSpec
    from nightshift.reports.report import RunTotals
    from nightshift.running.progress import LiveProgress

    clock = LiveProgress(CostSpec(gpus=2, usd_per_gpu_hour=2.0), show=False)
    clock.expect(100)
    clock._first_answer = 10.0
    totals = RunTotals(ok=18, failed=2, prompt_tokens=1000, output_tokens=100)
    p = clock.projection(30.0, totals)
    assert p["records_per_s"] == pytest.approx(1.0)
    assert p["tokens_per_s"] == pytest.approx(55.0)
    assert p["seconds_left"] == pytest.approx(80.0)
    assert p["usd"] == pytest.approx(2.0 * 2 * 110 / 3600)
    assert LiveProgress(CostSpec(), show=False).projection(5.0, RunTotals()) is None


def test_the_tail_is_the_time_from_90_to_100_percent_answered():
    from nightshift.jobs.spec import CostSpec
    from nightshift.running.progress import LiveProgress
    from nightshift.running.workerstats import tail_seconds

    clock = LiveProgress(CostSpec(), show=False)
    clock.expect(10)
    for answered, t in [(8, 1.0), (9, 2.5), (10, 7.0)]:
        clock._mark_tail(t, answered)
    assert clock.tail_s() == pytest.approx(4.5)
    samples = [{"t_s": t, "records": r} for t, r in [(0, 0), (2, 50), (4, 95), (9, 100)]]
    assert tail_seconds(samples) == pytest.approx(5.0)
