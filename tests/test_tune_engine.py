"""``jobs tune`` on the real engine (vLLM, the tiny model): the reference and the job
itself, each its own engine, agreement as counted from their two outputs."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app

from .test_tune import generate_job

pytestmark = pytest.mark.engine


def test_jobs_tune_on_vllm_compares_the_job_with_the_reference(models, tmp_path, write_spec):
    data = generate_job(models, tmp_path, records=40, max_tokens=8)
    data["engine"] = {**data["engine"], "kv_cache_dtype": "fp8", "max_num_seqs": 16}
    result = CliRunner().invoke(
        app,
        ["jobs", "tune", str(write_spec(data)), "--sample", "16", "--no-defaults", "--gpu", "h100"],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out.tune" / "tune.json").read_text())
    entries = {c["name"]: c for c in summary["candidates"]}
    assert list(entries) == ["reference", "job"] and summary["sample"]["records"] == 16
    assert entries["reference"]["kv_cache_dtype"] == "auto"
    texts = {
        name: dict(
            pl.read_parquet(f"{e['output']}/results/*.parquet")
            .select("ticket_id", "text")
            .iter_rows()
        )
        for name, e in entries.items()
    }
    same = sum(texts["job"].get(i) == t for i, t in texts["reference"].items()) / 16
    assert entries["job"]["agreement"] == pytest.approx(same)
    assert entries["reference"]["agreement"] == 1.0
    assert all(e["tokens_per_s"] > 0 and e["records_answered"] == 16 for e in entries.values())
    assert "| job |" in result.output and "chosen:" in result.output
    # what bound each run, from vLLM's own counters, beside the planner's H100 prediction
    for e in entries.values():
        measured, predicted = e["limit"]["measured"], e["limit"]["predicted"]
        assert 0 < measured["batch_reached"] <= 16 and 0 < measured["kv_cache_peak"] <= 1
        assert measured["tokens_per_step"] > 0 and measured["preemptions"] == 0
        assert e["bound_by"] == measured["bound_by"] is not None
        assert predicted["gpu"] == "h100" and 0 < predicted["batch"] <= 16
