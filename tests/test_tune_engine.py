"""``jobs tune`` on the real engine (vLLM, the tiny model): the reference and the job
itself, each its own engine running two rounds, agreement as counted from their outputs."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.intervals import wilson

from .test_tune import generate_job

pytestmark = pytest.mark.engine


def test_jobs_tune_on_vllm_compares_the_job_with_the_reference(models, tmp_path, write_spec):
    data = generate_job(models, tmp_path, records=40, max_tokens=8)
    data["engine"] = {**data["engine"], "kv_cache_dtype": "fp8", "max_num_seqs": 8}
    result = CliRunner().invoke(
        app,
        ["jobs", "tune", str(write_spec(data)), "--sample", "20", "--no-defaults", "--gpu", "h100"],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out.tune" / "tune.json").read_text())
    entries = {c["name"]: c for c in summary["candidates"]}
    # two rounds of 20 records each, on one engine per candidate, sharing no record
    assert list(entries) == ["reference", "job"] and summary["sample"]["records"] == 40
    assert summary["sample"]["per_round"] == 20 and summary["sample"]["rounds_on_other_records"]
    assert entries["reference"]["kv_cache_dtype"] == "auto"
    texts = {
        name: dict(
            pl.read_parquet(f"{e['output']}/round-*/results/*.parquet")
            .select("ticket_id", "text")
            .iter_rows()
        )
        for name, e in entries.items()
    }
    same = sum(texts["job"].get(i) == t for i, t in texts["reference"].items())
    assert entries["job"]["agreement"] == pytest.approx(same / 40)
    assert entries["job"]["agreement_ci"] == list(wilson(same, 40))
    assert entries["reference"]["agreement"] == 1.0
    for e in entries.values():
        assert e["tokens_per_s"] > 0 and e["records_answered"] == 40
        assert len(e["rounds_tokens_per_s"]) == 2 and not e.get("not_measurable")
    assert "| job |" in result.output and "Chosen:" in result.output
    # what bound each run, from vLLM's own counters, beside the planner's H100 prediction
    for e in entries.values():
        measured, predicted = e["limit"]["measured"], e["limit"]["predicted"]
        assert 0 < measured["batch_reached"] <= 8 and 0 < measured["kv_cache_peak"] <= 1
        assert measured["tokens_per_step"] > 0 and measured["preemptions"] == 0
        assert e["bound_by"] == measured["bound_by"] is not None
        assert predicted["gpu"] == "h100" and 0 < predicted["batch"] <= 8
