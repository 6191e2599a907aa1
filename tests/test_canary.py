"""``run.canary``: a sample under the job's settings and under the reference before the
full run, on the fake engine (whose FP8 KV cache changes a set share of answers when
NIGHTSHIFT_FAKE_FP8_CHANGES says so); tests/test_canary_engine.py runs it on vLLM."""

from __future__ import annotations

import json
from collections import Counter

import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.errors import SpecErrors
from nightshift.intervals import describe, wilson
from nightshift.jobs.loading import validate_spec

from .conftest import spec_dict, write_records

runner = CliRunner()


def canary_job(models, tmp_path, write_spec, records: int = 200, **canary) -> tuple:
    rows = [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i % 4}", "body": f"my order {i} is late"}
        for i in range(records)
    ]
    inputs = write_records(tmp_path / "in" / "t.parquet", rows)
    run = {"engine": "fake", "canary": {"records": 40, **canary}}
    data = spec_dict(models["chat"], inputs, tmp_path / "out", run=run)
    return write_spec(data), tmp_path / "out"


def _answers(folder) -> dict:
    files = sorted((folder / "results").glob("*.parquet"))
    rows = pl.read_parquet(files, columns=["ticket_id", "label"])
    return dict(zip(rows["ticket_id"], rows["label"], strict=True))


def test_a_canary_below_min_agreement_stops_the_job_with_the_figure(
    models, tmp_path, write_spec, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.3")
    log = tmp_path / "generated.log"
    monkeypatch.setenv("NIGHTSHIFT_FAKE_LOG", str(log))
    spec, out = canary_job(models, tmp_path, write_spec)
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 2, result.output
    kept = json.loads((out / "plan" / "canary.json").read_text())
    ref, job = _answers(out / "canary" / "reference"), _answers(out / "canary" / "job")
    assert len(ref) == len(job) == kept["records"] == 20  # a tenth of the job's 200
    same = sum(job[i] == a for i, a in ref.items())
    expected = same / len(ref)
    assert kept["agreement"] == pytest.approx(expected, abs=1e-4) and expected < 0.95
    # the interval from the counts, wholly under the bar: decided on the first sample
    assert kept["agreement_ci"] == list(wilson(same, 20)) and kept["agreement_ci"][1] < 0.95
    assert kept["decision"] == "below" and [r["records"] for r in kept["rounds"]] == [20]
    assert describe(wilson(same, 20)) in result.output
    assert f"{kept['agreement']:.1%}" in result.output
    assert "engine.kv_cache_dtype=fp8" in result.output and "min_agreement" in result.output
    assert not list((out / "committed").glob("*.json"))  # the full run did not start
    # accepted: the full run reuses the sample's answers, each prompt sent once more only
    # for the reference
    result = runner.invoke(app, ["jobs", "run", str(spec), "--set", "run.canary.accept=true"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    canary = report["canary"]
    assert canary["accepted"] and not canary["passed"]  # waved through, not cleared
    assert canary["answers_reused"] == 20 and canary["agreement"] == kept["agreement"]
    assert "canary:" in result.output and "accepted" in result.output
    sent = Counter(log.read_text().split())
    assert sum(sent.values()) == 200 + 20 and max(sent.values()) <= 2
    final = _answers(out)
    assert len(final) == 200 and all(final[i] == a for i, a in job.items())


def test_a_passing_canary_runs_the_job_and_reports_the_agreement(
    models, tmp_path, write_spec, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.02")
    spec, out = canary_job(models, tmp_path, write_spec, min_agreement=0.5)
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    canary = report["canary"]
    assert canary["status"] == "measured" and canary["passed"] and not canary["accepted"]
    # on the run's clock, after the plan and before the first answer: a band on the chart
    span, times = report["timeline"]["canary"], report["time_s"]
    assert times["prepare"] + times["plan"] <= span["began_s"] < span["ended_s"]
    assert span["ended_s"] <= min(s["started_s"] for s in report["shard_times"])
    assert span["ended_s"] - span["began_s"] == pytest.approx(canary["seconds"], abs=0.5)
    assert canary["agreement"] >= 0.5 and canary["settings"] == {"engine.kv_cache_dtype": "fp8"}
    assert canary["reference"] == {"engine.kv_cache_dtype": "auto"}
    # --overwrite measures again; the canary's folders are the run's own
    result = runner.invoke(app, ["jobs", "run", str(spec), "--overwrite"])
    assert result.exit_code == 0, result.output


def test_nothing_to_compare_where_the_setting_takes_no_effect(models, tmp_path, write_spec):
    spec, out = canary_job(models, tmp_path, write_spec)  # the fake's FP8 changes nothing
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 0, result.output
    canary = json.loads((out / "report.json").read_text())["canary"]
    assert canary["status"] == "nothing to compare" and "agreement" not in canary
    assert "canary: nothing to compare" in result.output
    assert not (out / "canary").exists()


def test_a_canary_a_fallback_left_with_nothing_to_compare_is_measured_next_run(
    models, tmp_path, write_spec, monkeypatch
):
    """A machine whose engine could not hold FP8 compares nothing; the next run (here:
    new records arrive, FP8 now takes effect) measures the canary instead of going on
    with FP8 unchecked for good."""
    from nightshift.pipelines import canary as canary_module

    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.02")
    monkeypatch.setattr(canary_module, "kv_fallback_reason", lambda spec: "no AVX-512 here")
    spec, out = canary_job(models, tmp_path, write_spec, min_agreement=0.5)
    assert runner.invoke(app, ["jobs", "run", str(spec)]).exit_code == 0
    kept = json.loads((out / "plan" / "canary.json").read_text())
    assert kept["status"] == "nothing to compare" and kept["measure_again"]
    monkeypatch.undo()
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.02")
    rows = [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i % 4}", "body": f"my order {i} is late"}
        for i in range(240)
    ]
    write_records(tmp_path / "in" / "t.parquet", rows)  # 40 new records in the input
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 0, result.output
    kept = json.loads((out / "plan" / "canary.json").read_text())
    assert kept["status"] == "measured" and kept["agreement"] >= 0.5


def test_canary_off_and_its_keys_checked(models, tmp_path, write_spec, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.3")
    spec, out = canary_job(models, tmp_path, write_spec, enabled=False)
    assert runner.invoke(app, ["jobs", "run", str(spec)]).exit_code == 0
    assert "canary" not in json.loads((out / "report.json").read_text())
    base = spec_dict("m", "i", "o")
    assert validate_spec({**base, "run": {"canary": False}}).run.canary.enabled is False
    with pytest.raises(SpecErrors, match="run.canary.min_agreement"):
        validate_spec({**base, "run": {"canary": {"min_agreement": 2}}})
