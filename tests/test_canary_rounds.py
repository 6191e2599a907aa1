"""The canary's decision by its 95% interval on the fake engine: a sample whose interval
straddles ``run.canary.min_agreement`` grows (only new records run) up to its cap, the
flips against the reference where the job has labels, and workers that share one
measure (the first measures under a lease, the others wait; a dead measurer's lease
expires and another takes over)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import polars as pl
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.intervals import describe, wilson
from nightshift.io.outputs import JobOutput
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines import canary as measuring
from nightshift.running import canary as verdict
from nightshift.scheduling.dryrun import plan_summary

from .conftest import spec_dict, write_records

runner = CliRunner()
LABELS = ["billing", "bug", "feature_request", "account", "other"]


def job_data(models, tmp_path, records=200, labels=None, **canary) -> dict:
    rows = [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i % 4}", "body": f"my order {i} is late"}
        for i in range(records)
    ]
    if labels:
        rows = [{**r, "truth": labels[r["ticket_id"]]} for r in rows]
    inputs = write_records(tmp_path / "in" / "t.parquet", rows)
    run = {"engine": "fake", "canary": {"records": 40, **canary}}
    extra = {"eval": {"label_column": "truth"}} if labels else {}
    return spec_dict(models["chat"], inputs, tmp_path / "out", run=run, **extra)


def _answers(folder) -> dict:
    files = sorted((folder / "results").glob("*.parquet"))
    rows = pl.read_parquet(files, columns=["ticket_id", "label"])
    return dict(zip(rows["ticket_id"], rows["label"], strict=True))


def _same(out) -> tuple[int, int, dict, dict]:
    ref, job = _answers(out / "canary" / "reference"), _answers(out / "canary" / "job")
    return sum(job.get(i) == a for i, a in ref.items()), len(ref), ref, job


def test_an_undecided_sample_grows_to_its_cap_running_only_new_records(
    models, tmp_path, write_spec, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.1")
    log = tmp_path / "generated.log"
    monkeypatch.setenv("NIGHTSHIFT_FAKE_LOG", str(log))
    spec = write_spec(job_data(models, tmp_path, min_agreement=0.9, accept=True))
    out = tmp_path / "out"
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 0, result.output
    kept = json.loads((out / "plan" / "canary.json").read_text())
    # 20 (a tenth of the job), doubled to 40, then the cap: a quarter of the job
    assert [r["records"] for r in kept["rounds"]] == [20, 40, 50]
    assert kept["records"] == kept["max_records"] == 50
    same, total, _, _ = _same(out)
    assert total == 50 and kept["agreement_ci"] == list(wilson(same, 50))
    assert kept["agreement_ci"][0] < 0.9 <= kept["agreement_ci"][1]  # still straddling
    assert kept["decision"] == "point value at the cap"
    report = json.loads((out / "report.json").read_text())
    assert report["canary"]["undecided"] and "undecided at the cap" in result.output
    shown = describe(wilson(same, 50))
    assert shown in result.output and shown in (out / "report.md").read_text()
    assert report["canary"]["passed"] == (same / 50 >= 0.9)
    # each sampled prompt ran once per side however many rounds; the job reused its 50
    sent = Counter(log.read_text().split())
    assert sum(sent.values()) == 200 + 50 and max(sent.values()) <= 2
    assert report["canary"]["answers_reused"] == 50
    # the rounds are the canary's own time band
    assert report["time_s"]["canary"] >= sum(r["seconds"] for r in kept["rounds"]) - 0.5


def test_max_records_caps_the_sample_and_a_decisive_one_stops_at_once(
    models, tmp_path, write_spec, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.1")
    spec = write_spec(job_data(models, tmp_path, min_agreement=0.9, max_records=30))
    runner.invoke(app, ["jobs", "run", str(spec)])
    kept = json.loads((tmp_path / "out" / "plan" / "canary.json").read_text())
    assert [r["records"] for r in kept["rounds"]] == [20, 30]
    assert verdict.decide((0.91, 0.99), 0.9) == verdict.ABOVE  # lower bound at/above
    assert verdict.decide((0.9, 0.99), 0.9) == verdict.ABOVE
    assert verdict.decide((0.5, 0.89), 0.9) == verdict.BELOW
    assert verdict.decide((0.85, 0.95), 0.9) == verdict.MORE


def test_flips_against_the_reference_where_the_job_has_labels(
    models, tmp_path, write_spec, monkeypatch
):
    # labels the reference gets right on every other record: its answers, run first
    plain = job_data(models, tmp_path / "plain", enabled=False)
    plain["engine"] = {**plain["engine"], "kv_cache_dtype": "auto"}
    assert runner.invoke(app, ["jobs", "run", str(write_spec(plain))]).exit_code == 0
    first = _answers(tmp_path / "plain" / "out")
    truth = {
        i: a if int(i[1:]) % 2 else LABELS[(LABELS.index(a) + 1) % 5] for i, a in first.items()
    }
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.3")
    spec = write_spec(job_data(models, tmp_path, labels=truth))
    out = tmp_path / "out"
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 2, result.output
    kept = json.loads((out / "plan" / "canary.json").read_text())
    _, _, ref, job = _same(out)
    right_to_wrong = sum(a == truth[i] and job.get(i) != truth[i] for i, a in ref.items())
    wrong_to_right = sum(a != truth[i] and job.get(i) == truth[i] for i, a in ref.items())
    assert kept["flips"] == {
        "right_to_wrong": right_to_wrong,
        "wrong_to_right": wrong_to_right,
        "of": len(ref),
    }
    assert right_to_wrong > 0  # the fake's FP8 changed some right answers
    line = verdict.summary_line({**kept, "min_agreement": 0.95, "passed": False})
    assert f"{right_to_wrong} right to wrong, {wrong_to_right} wrong to right" in line


def test_two_workers_after_plan_write_share_one_canary(models, tmp_path, write_spec):
    """The documented recipe: `jobs plan --write`, then only `jobs work` on each machine.
    One worker measures the canary, the other waits for its measure; each sampled prompt
    runs once per side."""
    data = job_data(models, tmp_path, min_agreement=0.5)
    data["plan"] = {"shard_records": 25}
    plan_summary(validate_spec(data), write=True)
    spec, log = write_spec(data), tmp_path / "generated.log"
    env = {**os.environ, "NIGHTSHIFT_FAKE_FP8_CHANGES": "0.02", "NIGHTSHIFT_FAKE_LOG": str(log)}
    command = [sys.executable, "-m", "nightshift.cli", "jobs", "work", str(spec)]
    workers = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [w.communicate(timeout=400)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    out = tmp_path / "out"
    kept = json.loads((out / "plan" / "canary.json").read_text())
    assert kept["status"] == "measured" and kept["records"] == 20
    assert len(list((out / "committed").glob("*.json"))) == 8
    sent = Counter(log.read_text().split())
    assert sum(sent.values()) == 200 + 20  # measured once: the reference's 20, once


def test_a_dead_measurers_lease_expires_and_a_worker_measures(
    models, tmp_path, write_spec, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.02")
    monkeypatch.setattr(measuring, "POLL_S", 0.1)
    data = job_data(models, tmp_path, min_agreement=0.5)
    data["run"]["lease_s"] = 3
    plan_summary(validate_spec(data), write=True)
    store = JobOutput(str(tmp_path / "out")).store
    assert measuring.CanaryLease(store, "dead", ttl_s=3).claim(0) is not None  # then died
    result = runner.invoke(app, ["jobs", "work", str(write_spec(data))])
    assert result.exit_code == 0, result.output
    kept = json.loads((tmp_path / "out" / "plan" / "canary.json").read_text())
    assert kept["status"] == "measured" and kept["agreement"] >= 0.5
    assert len(store.list("leases/canary/")) == 2  # the dead one's, then the taker's
