"""A run killed while it writes its plan's files keeps the plan it built.

Planning a million records takes half a minute; the plan's keys are stored before its
shard files (``plan/built.json`` last), and each shard file as soon as it is written.
A rerun of the same job over the same input writes only the shard files missing, and
plans nothing again; a changed spec or input plans afresh.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import polars as pl
import pytest
import yaml

from .conftest import write_records
from .durable import NIGHTSHIFT, assert_exactly_once, fake_job, report, run_cli, tickets

RECORDS = 120


@pytest.fixture
def job(models, tmp_path):
    """120 tickets in 2 files, 1 of them a reject; 6 shards of 20."""
    rows = tickets(RECORDS, subjects=5, repeats=7)
    rows[9]["body"] = None
    return fake_job(models, tmp_path, rows, files=2, shard_records=20)


def shard_files(out: Path) -> dict[str, int]:
    """Each stored shard file's modification time, by name."""
    return {p.name: p.stat().st_mtime_ns for p in sorted((out / "plan" / "shards").glob("*"))}


def kill_at(spec_path: Path, point: str) -> None:
    killed = run_cli(spec_path, env={"NIGHTSHIFT_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr


def test_a_rerun_writes_only_the_shard_files_the_killed_run_did_not(job, tmp_path):
    spec_path, _, ids = job
    out = tmp_path / "out"
    kill_at(spec_path, "plan.shard_written:2")
    before = shard_files(out)
    assert len(before) == 2 and (out / "plan" / "built.json").exists()
    status = subprocess.run(
        [*NIGHTSHIFT, "jobs", "status", str(out)], capture_output=True, text=True
    )
    assert status.returncode == 2 and "did not finish writing" in status.stderr
    assert not (out / "plan" / "plan.json").exists()
    records = (out / "plan" / "records.parquet").stat().st_mtime_ns
    rerun = run_cli(spec_path)
    assert rerun.returncode == 0, rerun.stderr
    after = shard_files(out)
    assert len(after) == 6
    assert {name: after[name] for name in before} == before  # kept, not written again
    assert (out / "plan" / "records.parquet").stat().st_mtime_ns == records  # not planned again
    assert not (out / "plan" / "built.json").exists()
    assert not (out / "plan" / "built-rejects.parquet").exists()
    assert_exactly_once(str(out), "ticket_id", ids)
    assert report(str(out))["records"]["rejected"] == 1


def test_the_kept_plan_writes_the_same_files_as_an_unbroken_run(job, tmp_path):
    spec_path, spec, _ = job
    kill_at(spec_path, "plan.built")
    assert run_cli(spec_path).returncode == 0
    spec["output"]["path"] = str(tmp_path / "unbroken")
    other = tmp_path / "unbroken.yaml"
    other.write_text(yaml.safe_dump(spec))
    assert run_cli(other).returncode == 0
    for name in [*shard_files(tmp_path / "out"), "../records.parquet"]:
        kept = pl.read_parquet(tmp_path / "out" / "plan" / "shards" / name)
        unbroken = pl.read_parquet(tmp_path / "unbroken" / "plan" / "shards" / name)
        assert kept.equals(unbroken), name
    kept_rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet")
    assert kept_rejects.equals(pl.read_parquet(tmp_path / "unbroken" / "rejects.parquet"))


def test_a_changed_spec_plans_afresh_and_leaves_no_shard_of_the_old_plan(job, tmp_path):
    spec_path, spec, ids = job
    out = tmp_path / "out"
    kill_at(spec_path, "plan.shard_written:3")
    spec["plan"]["shard_records"] = 50  # 3 shards now, not 6
    spec["prompt"]["template"] = "Ticket: {subject}\n\n{body}"
    spec_path.write_text(yaml.safe_dump(spec))
    rerun = run_cli(spec_path)
    assert rerun.returncode == 0, rerun.stderr
    assert len(shard_files(out)) == 3  # the old plan's shards 3-5 are gone
    shard = pl.read_parquet(out / "plan" / "shards" / "shard-00000.parquet")
    assert shard.height == 50
    assert_exactly_once(str(out), "ticket_id", ids)


def test_changed_input_plans_afresh(job, tmp_path):
    spec_path, _, ids = job
    out = tmp_path / "out"
    kill_at(spec_path, "plan.shard_written:2")
    extra = [{"ticket_id": f"n{i}", "subject": "new", "body": f"new {i}"} for i in range(30)]
    write_records(tmp_path / "in" / "p2.parquet", extra)  # a file added since
    rerun = run_cli(spec_path)
    assert rerun.returncode == 0, rerun.stderr
    assert len(shard_files(out)) == 8  # 150 records: planned again, with the new file
    assert_exactly_once(str(out), "ticket_id", ids + [r["ticket_id"] for r in extra])


def test_a_plan_another_run_wrote_meanwhile_is_taken_up_never_deleted(job, tmp_path, monkeypatch):
    """Two runs of one job start on a fresh output: the one that finishes planning second
    takes up the other's plan (it deleted its plan.json and shard files under it)."""
    import nightshift.running.runner as runner
    from nightshift.jobs.fingerprint import plan_stamp
    from nightshift.jobs.loading import validate_spec
    from nightshift.pipelines.direct import run_job
    from nightshift.scheduling.increments import input_listing
    from nightshift.scheduling.plan import describe

    _, spec, ids = job
    spec = validate_spec(spec)
    out = tmp_path / "out"
    real = runner.build_plan

    def other_run_first(spec, encoder, progress, **more):  # the other run writes meanwhile
        plan = real(spec, encoder, progress, **more)
        summary = {**describe(plan, spec), **plan_stamp(spec), **encoder.identity().as_plan()}
        runner.JobOutput(str(out)).plans.write(
            plan, {**summary, "input_listing": input_listing(spec)}
        )
        return plan

    monkeypatch.setattr(runner, "build_plan", other_run_first)
    outcome = run_job(spec, progress=False)
    assert outcome.report["shards"]["complete"]
    assert len(shard_files(out)) == 6
    assert_exactly_once(str(out), "ticket_id", ids)


def test_a_stored_shard_file_that_is_not_whole_is_written_again(job, tmp_path):
    spec_path, _, ids = job
    out = tmp_path / "out"
    kill_at(spec_path, "plan.shard_written:3")
    (out / "plan" / "shards" / "shard-00001.parquet").write_bytes(b"")  # not a shard file
    assert run_cli(spec_path).returncode == 0
    assert pl.read_parquet(out / "plan" / "shards" / "shard-00001.parquet").height > 0
    assert_exactly_once(str(out), "ticket_id", ids)


@pytest.mark.parametrize("damage", ["a column gone", "a record gone"])
def test_kept_keys_that_are_not_what_the_plan_wrote_are_planned_afresh(job, tmp_path, damage):
    spec_path, _, ids = job
    out = tmp_path / "out"
    kill_at(spec_path, "plan.shard_written:2")
    records = out / "plan" / "records.parquet"
    frame = pl.read_parquet(records)
    frame = frame.drop("_row") if damage == "a column gone" else frame.slice(1)
    frame.write_parquet(records)
    rerun = run_cli(spec_path)
    assert rerun.returncode == 0, rerun.stderr
    assert_exactly_once(str(out), "ticket_id", ids)


def test_an_input_file_rewritten_with_its_size_and_time_is_planned_afresh(job, tmp_path):
    """The listing (names, sizes, modification times) cannot see it; the rows can."""
    import os

    spec_path, _, ids = job
    out = tmp_path / "out"
    path = tmp_path / "in" / "p1.parquet"
    before = pl.read_parquet(path)
    for name in ("p0.parquet", "p1.parquet"):  # sizes that do not vary, types alike
        one = tmp_path / "in" / name
        pl.read_parquet(one).write_parquet(one, compression="uncompressed")
    kill_at(spec_path, "plan.shard_written:3")
    stat = path.stat()
    rewritten = before.with_columns(pl.col("ticket_id").str.replace("^t", "u"))
    rewritten.write_parquet(path, compression="uncompressed")
    assert path.stat().st_size == stat.st_size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    rerun = run_cli(spec_path)
    assert rerun.returncode == 0, rerun.stderr
    new_ids = ids[:60] + rewritten["ticket_id"].to_list()
    assert_exactly_once(str(out), "ticket_id", new_ids)


def test_built_files_left_beside_a_written_plan_are_removed_by_the_resume(job, tmp_path):
    spec_path, _, ids = job
    out = tmp_path / "out"
    kill_at(spec_path, "plan.before_manifest")
    assert run_cli(spec_path, env={"NIGHTSHIFT_CRASH_AT": "shard.data_written"}).returncode
    (out / "plan" / "built.json").write_text("{}")  # as a kill after plan.json leaves it
    assert run_cli(spec_path).returncode == 0
    assert not (out / "plan" / "built.json").exists()
    assert_exactly_once(str(out), "ticket_id", ids)
