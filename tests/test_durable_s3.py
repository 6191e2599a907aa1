"""The durable-output guarantees with the output on a real S3 server (SeaweedFS on
loopback), including kills mid-run and an endpoint that fails requests."""

from __future__ import annotations

import signal
import uuid

import pytest
import yaml

from nightshift.engines.fake import FakeEngine
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records
from .durable import (
    assert_exactly_once,
    generated_prompts,
    output_status_or_empty,
    report,
    run_cli,
    shard_prompts,
)

pytest_plugins = ["tests.s3server"]


@pytest.fixture
def s3_job(models, tmp_path, s3_env):
    """120 tickets (one over-length) into a fresh S3 prefix; 3 shards of 40, chunks of 8."""
    rows = [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i % 5}", "body": f"body {i} " * (1 + i % 7)}
        for i in range(120)
    ]
    rows[9]["body"] = "long " * 3000
    write_records(tmp_path / "in" / "a.parquet", rows)
    out = f"s3://{s3_env.bucket}/jobs/{uuid.uuid4().hex[:8]}/out"
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        out,
        plan={"shard_records": 40},
        run={"chunk_records": 8, "engine": "fake"},
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path, spec, out, [r["ticket_id"] for r in rows]


@pytest.mark.parametrize(
    "point", ["plan.shard_written:2", "chunk.written:4", "shard.data_written:2"]
)
def test_a_kill_then_a_rerun_on_s3_gives_every_record_once(s3_job, s3_env, tmp_path, point):
    spec_path, spec, out, ids = s3_job
    env = s3_env.env()
    first = run_cli(spec_path, env={**env, "NIGHTSHIFT_CRASH_AT": point})
    assert first.returncode == -signal.SIGKILL, first.stderr
    done_before = output_status_or_empty(out)
    log = tmp_path / "second.log"
    second = run_cli(spec_path, env={**env, "NIGHTSHIFT_FAKE_LOG": str(log)})
    assert second.returncode == 0, second.stderr
    assert_exactly_once(out, "ticket_id", ids)
    shards, regenerated = shard_prompts(spec), set(generated_prompts(log))
    assert all(not shards[s] & regenerated for s in done_before)
    # The attempt that died between data and marker left files no marker names: gone now.
    assert report(out)["shards"]["complete"]


def test_a_job_completes_exactly_through_an_endpoint_that_fails_requests(
    s3_job, s3_env, fault_proxy, monkeypatch
):
    _, spec, out, ids = s3_job
    proxy = fault_proxy(rate=0.15, seed=3)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    run_job(validate_spec(spec), engine=FakeEngine(), progress=False)
    assert proxy.faults > 5, proxy.injected
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.endpoint)  # read back without faults
    assert_exactly_once(out, "ticket_id", ids)
    assert report(out)["records"]["rejected"] == 1


def test_kills_at_random_moments_on_s3_never_lose_or_repeat_a_record(s3_job, s3_env):
    """Timed SIGKILLs land wherever they land: mid-plan, mid-chunk, mid-upload."""
    import os
    import subprocess
    import time

    from .durable import NIGHTSHIFT

    spec_path, _, out, ids = s3_job
    env = {**os.environ, **s3_env.env(), "NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.03"}
    for delay in (5.0, 7.0):
        process = subprocess.Popen(
            [*NIGHTSHIFT, "jobs", "run", str(spec_path), "-q"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
    final = run_cli(spec_path, env=s3_env.env())
    assert final.returncode == 0, final.stderr
    assert_exactly_once(out, "ticket_id", ids)
