"""Kill it at any instant, run the same command again: every record exactly once.

Jobs run in subprocesses on the fake engine, are SIGKILLed at named crash points
(``nightshift.faults``) or at timed moments, and are then rerun. Output goes to a local
directory here; tests/test_durable_s3.py runs the same checks against a real S3 server.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
import yaml

from nightshift.engines.fake import FakeEngine
from nightshift.errors import OutputExistsError, ShardsFailedError
from nightshift.jobs.loading import validate_spec
from nightshift.jobs.status import output_status
from nightshift.pipelines.direct import run_job

from .durable import (
    NIGHTSHIFT,
    assert_exactly_once,
    fake_job,
    generated_prompts,
    output_status_or_empty,
    report,
    run_cli,
    shard_prompts,
    tickets,
)

RECORDS = 150


@pytest.fixture
def job(models, tmp_path):
    """150 tickets (3 of them rejects) in 3 files; 4 shards of 40; chunks of 8."""
    rows = tickets(RECORDS, subjects=7, repeats=9)
    rows[5]["body"] = None
    rows[77]["body"] = "long " * 3000
    rows[120]["ticket_id"] = "t001"  # a duplicate
    return fake_job(models, tmp_path, rows, files=3, shard_records=40)


CRASH_POINTS = [
    "plan.built",  # the plan's keys and built.json stored, no shard file yet
    "plan.shard_written:2",  # two shard files stored, the rest not yet
    "plan.before_manifest",  # plan data written, plan.json not yet
    "chunk.written:3",  # a chunk's file written, progress.json not yet
    "shard.data_written",  # first shard's data written, its marker not yet
    "shard.data_written:3",  # two shards committed, the third between data and marker
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_kill_at_a_crash_point_then_a_rerun_gives_every_record_once(job, tmp_path, point):
    spec_path, spec, ids = job
    out = str(tmp_path / "out")
    first = run_cli(spec_path, env={"NIGHTSHIFT_CRASH_AT": point})
    assert first.returncode == -signal.SIGKILL, first.stderr
    committed_before = set(output_status_or_empty(out))
    log = tmp_path / "second.log"
    second = run_cli(spec_path, env={"NIGHTSHIFT_FAKE_LOG": str(log)})
    assert second.returncode == 0, second.stderr
    assert_exactly_once(out, "ticket_id", ids)
    # No shard committed before the kill is generated again.
    shards = shard_prompts(spec)
    regenerated = set(generated_prompts(log))
    for shard in committed_before:
        assert not shards[shard] & regenerated, f"shard {shard} was generated twice"
    assert report(out)["records"]["rejected"] == 3


def test_timed_kills_at_random_moments_never_lose_or_repeat_a_record(job, tmp_path):
    spec_path, _, ids = job
    out = str(tmp_path / "out")
    slow = {"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.03"}
    for delay in (4.0, 6.0, 8.0):
        process = subprocess.Popen(
            [*NIGHTSHIFT, "jobs", "run", str(spec_path), "-q"],
            env={**__import__("os").environ, **slow},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
    final = run_cli(spec_path)
    assert final.returncode == 0, final.stderr
    assert_exactly_once(out, "ticket_id", ids)


def test_a_dead_engine_is_replaced_and_the_shard_continues(job, tmp_path):
    _, spec, ids = job
    job_spec = validate_spec(spec)
    engines = iter([FakeEngine(die_after=30), FakeEngine()])
    import nightshift.running.engines as runner

    original = runner.build_engine
    runner.build_engine = lambda s: next(engines)
    try:
        outcome = run_job(job_spec, progress=False)
    finally:
        runner.build_engine = original
    assert outcome.report["this_run"]["engine_starts"] == 2
    assert outcome.report["shards"]["complete"]
    assert_exactly_once(str(tmp_path / "out"), "ticket_id", ids)


def test_a_shard_that_keeps_failing_is_named_and_a_rerun_finishes_it(job, tmp_path, monkeypatch):
    import nightshift.running.engines as runner

    _, spec, ids = job
    spec["run"]["shard_attempts"] = 2
    # Every engine dies after 5 answers: each attempt checkpoints 5 records of a shard
    # (shards hold 20-40), so after 2 attempts every shard is unfinished and named failed.
    monkeypatch.setattr(runner, "build_engine", lambda s: FakeEngine(die_after=5))
    with pytest.raises(ShardsFailedError, match=r"still failed after 2 attempts: shard 0 \(") as e:
        run_job(validate_spec(spec), progress=False)
    status = output_status(str(tmp_path / "out"))
    shards = len(status["each"])
    assert status["shards"]["failed"] == shards and f"shard {shards - 1} (" in str(e.value)
    assert status["records"]["ok"] + status["records"]["failed"] == shards * 10  # checkpointed
    monkeypatch.setattr(runner, "build_engine", lambda s: FakeEngine())
    run_job(validate_spec(spec), progress=False)
    assert_exactly_once(str(tmp_path / "out"), "ticket_id", ids)


def test_a_changed_spec_is_refused_and_new_run_starts_beside(job, tmp_path):
    spec_path, spec, ids = job
    assert run_cli(spec_path).returncode == 0
    spec["prompt"]["template"] = "Ticket: {subject}\n\n{body}"
    spec["sampling"]["temperature"] = 0.7
    spec_path.write_text(yaml.safe_dump(spec))
    refused = run_cli(spec_path)
    assert refused.returncode == 2
    assert "prompt, sampling changed" in refused.stderr and "--new-run" in refused.stderr
    beside = run_cli(spec_path, "--new-run")
    assert beside.returncode == 0, beside.stderr
    assert_exactly_once(str(tmp_path / "out-run2"), "ticket_id", ids)
    assert_exactly_once(str(tmp_path / "out"), "ticket_id", ids)  # untouched


def test_settings_that_do_not_change_results_resume(job, tmp_path):
    _, spec, _ = job
    run_job(validate_spec(spec), progress=False)
    spec["engine"]["max_num_seqs"] = 8
    spec["cost"]["usd_per_gpu_hour"] = 9.0
    again = run_job(validate_spec(spec), progress=False).report
    assert again["this_run"]["records_answered"] == 0  # nothing left to do


def test_status_of_a_partial_job(job, tmp_path):
    spec_path, _, _ = job
    # killed in the second shard's commit: commits run one after another, so the first
    # has its marker (a crash at the tenth chunk raced the commit thread)
    run_cli(spec_path, env={"NIGHTSHIFT_CRASH_AT": "shard.data_written:2"})
    status = output_status(str(tmp_path / "out"))
    assert status["shards"]["done"] >= 1 and status["shards"]["partial"] >= 1
    r = status["records"]
    assert r["input"] == r["ok"] + r["rejected"] + r["failed"] + r["not_yet_run"]
    text = subprocess.run(
        [*NIGHTSHIFT, "jobs", "status", str(tmp_path / "out")], capture_output=True, text=True
    )
    assert "partly done" in text.stdout and "answered" in text.stdout


def test_export_writes_one_parquet_of_the_committed_records(job, tmp_path):
    import polars as pl

    spec_path, _, ids = job
    assert run_cli(spec_path).returncode == 0
    done = subprocess.run(
        [*NIGHTSHIFT, "jobs", "export", str(tmp_path / "out"), str(tmp_path / "all.parquet")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    merged = pl.read_parquet(tmp_path / "all.parquet")
    assert (
        merged["ticket_id"].n_unique()
        == merged.height
        == report(str(tmp_path / "out"))["records"]["ok"]
    )


def test_an_older_run_without_a_plan_is_not_mixed(job, tmp_path):
    _, spec, _ = job
    (tmp_path / "out" / "results").mkdir(parents=True)
    (tmp_path / "out" / "report.json").write_text('{"job": "test-job", "records": {}}')
    with pytest.raises(OutputExistsError, match="--overwrite"):
        run_job(validate_spec(spec), progress=False)
    run_job(validate_spec(spec), progress=False, overwrite=True)
