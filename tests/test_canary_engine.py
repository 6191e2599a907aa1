"""``run.canary`` on the real engine (vLLM, the tiny model): an FP8 KV cache measured
against the model's dtype on a sample before the full run, its figure counted from the
two canary outputs; where FP8 cannot take effect here, "nothing to compare"."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.engines.vllm_engine import fp8_kv_unsupported_reason
from nightshift.intervals import wilson

from .test_tune import generate_job

pytestmark = pytest.mark.engine


def _texts(folder) -> dict:
    rows = pl.read_parquet(sorted((folder / "results").glob("*.parquet")))
    return dict(rows.select("ticket_id", "text").iter_rows())


def test_an_fp8_canary_on_vllm_reports_what_the_two_outputs_say(models, tmp_path, write_spec):
    data = generate_job(models, tmp_path, records=80, max_tokens=8)
    data["engine"] = {**data["engine"], "kv_cache_dtype": "fp8", "max_num_seqs": 16}
    data["run"] = {**data["run"], "canary": {"records": 8, "min_agreement": 1.0, "max_records": 8}}
    result = CliRunner().invoke(app, ["jobs", "run", str(write_spec(data))])
    out = tmp_path / "out"
    kept = json.loads((out / "plan" / "canary.json").read_text())
    if fp8_kv_unsupported_reason() is not None:  # no AVX-512: the job runs as its reference
        assert kept["status"] == "nothing to compare" and "falls back" in kept["reason"]
        assert result.exit_code == 0, result.output
        return
    ref, job = _texts(out / "canary" / "reference"), _texts(out / "canary" / "job")
    assert len(ref) == len(job) == kept["records"] == 8
    same = sum(job[i] == text for i, text in ref.items()) / len(ref)
    assert kept["agreement"] == pytest.approx(same, abs=1e-4)
    agreeing = sum(job[i] == text for i, text in ref.items())
    assert kept["agreement_ci"] == list(wilson(agreeing, 8))  # one round: max_records 8
    assert kept["settings"] == {"engine.kv_cache_dtype": "fp8"}
    report = json.loads((out / "report.json").read_text()) if result.exit_code == 0 else None
    if same < 1.0:  # min_agreement 1.0: any changed answer stops the job, naming it
        assert result.exit_code == 2, result.output
        assert "engine.kv_cache_dtype=fp8" in result.output
        assert f"{kept['agreement']:.1%}" in result.output
    else:  # every answer kept: the full run goes on and reuses the sample's answers
        assert result.exit_code == 0, result.output
        assert report["canary"]["answers_reused"] == 8
        assert report["records"]["ok"] == 80
