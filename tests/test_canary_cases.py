"""The canary's harder cases on the fake engine: a worker judging by the kept measure, an
embed job, records that sample through ``input.sampling_column``, a narrower
``model.dtype``, and the canary's time kept out of generation time."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.jobs.loading import validate_spec
from nightshift.running import canary as verdict

from .conftest import spec_dict, write_records

runner = CliRunner()


def rows(n: int, sampling=None) -> list[dict]:
    found = []
    for i in range(n):
        row = {"ticket_id": f"t{i:03d}", "subject": f"s{i % 4}", "body": f"my order {i} is late"}
        if sampling is not None:
            row["s"] = sampling(i)
        found.append(row)
    return found


def job(models, tmp_path, write_spec, records=rows(80), model=None, **sections):
    inputs = write_records(tmp_path / "in" / "t.parquet", records)
    run = {"engine": "fake", "canary": {"records": 40}, **sections.pop("run", {})}
    data = spec_dict(model or models["chat"], inputs, tmp_path / "out", run=run, **sections)
    return write_spec(data), tmp_path / "out"


def test_a_worker_claims_nothing_below_the_bar_and_the_summary_follows_the_figure(
    models, tmp_path, write_spec, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.3")
    spec, out = job(models, tmp_path, write_spec, plan={"shard_records": 20})
    assert runner.invoke(app, ["jobs", "run", str(spec)]).exit_code == 2
    result = runner.invoke(app, ["jobs", "work", str(spec)])
    assert result.exit_code == 2, result.output
    assert "canary:" in result.output and "min_agreement" in result.output
    assert not list((out / "committed").glob("*.json"))  # no shard claimed
    # accepted under the worker's own keys: it runs every shard
    result = runner.invoke(app, ["jobs", "work", str(spec), "--set", "run.canary.accept=true"])
    assert result.exit_code == 0, result.output
    assert len(list((out / "committed").glob("*.json"))) == 4
    # a later run without the acceptance: the figure is below the bar, and says so
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert "below min_agreement, not accepted" in result.output, result.output
    canary = json.loads((out / "report.json").read_text())["canary"]
    assert not canary["passed"] and not canary["accepted"]
    assert verdict.summary_line({**canary, "passed": True}).endswith("(passed, min 95%)")


def test_an_embed_job_runs_its_canary_as_an_embed_job(models, tmp_path, write_spec, monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.1")
    spec, out = job(models, tmp_path, write_spec, task={"kind": "embed"})
    data = __import__("yaml").safe_load(spec.read_text())
    del data["sampling"], data["input"]["keep_columns"]
    data["prompt"] = {"template": "{body}"}  # as the user writes it: no sampling section
    spec.write_text(json.dumps(data))
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 0, result.output
    canary = json.loads((out / "report.json").read_text())["canary"]
    assert canary["status"] == "measured" and canary["agreement"] == 1.0  # vectors by cosine
    assert len(list((out / "canary" / "job" / "results").glob("*.parquet"))) >= 1


def test_the_canary_compares_only_records_whose_answers_are_deterministic(
    models, tmp_path, write_spec, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.0001")  # changes (almost) nothing
    hot = json.dumps({"temperature": 0.8})
    input_ = {"sampling_column": "s", "keep_columns": ["subject"]}
    generate = {"task": {"kind": "generate"}, "sampling": {"max_tokens": 4}}
    # every record samples: nothing to compare, and the job runs
    spec, out = job(models, tmp_path, write_spec, rows(80, lambda i: hot), **generate)
    data = __import__("yaml").safe_load(spec.read_text())
    spec.write_text(json.dumps({**data, "input": {**data["input"], **input_}}))
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 0, result.output
    canary = json.loads((out / "report.json").read_text())["canary"]
    assert canary["status"] == "nothing to compare" and "deterministic" in canary["reason"]
    # half of them greedy (one with a seed): those are compared, the rest left out
    shutil.rmtree(out)
    sampled = lambda i: hot if i % 2 else (json.dumps({"seed": 3}) if i == 0 else None)  # noqa: E731
    write_records(tmp_path / "in" / "t.parquet", rows(80, sampled))
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 0, result.output
    canary = json.loads((out / "report.json").read_text())["canary"]
    assert canary["status"] == "measured" and canary["agreement"] >= 0.95
    # 8 of 8 agreeing is 67.6-100%: the sample doubles to its cap, a quarter of the job
    assert [r["records"] for r in canary["rounds"]] == [8, 16, 20]
    assert canary["records"] == 20 and canary["records_left_out_sampled"] == 40
    compared = (out / "canary" / "job" / "results").glob("*.parquet")
    ids = set(__import__("polars").read_parquet(list(compared))["ticket_id"])
    assert all(int(i[1:]) % 2 == 0 for i in ids)


def test_a_narrower_model_dtype_is_measured_even_where_the_fp8_kv_cache_falls_back(
    models, tmp_path, write_spec, monkeypatch
):
    """bfloat16 weights for a float32 model change answers: the reference runs the
    model's own dtype, and the canary measures it though FP8 takes no effect here."""
    from nightshift.pipelines import canary as canary_module

    wide = tmp_path / "fp32-model"
    shutil.copytree(models["chat"], wide)
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
    monkeypatch.setattr(canary_module, "kv_fallback_reason", lambda spec: "no AVX-512 here")
    spec, out = job(models, tmp_path, write_spec, model=wide)
    data = __import__("yaml").safe_load(spec.read_text())
    data["model"]["dtype"] = "bfloat16"
    spec.write_text(json.dumps(data))
    result = runner.invoke(app, ["jobs", "run", str(spec)])
    assert result.exit_code == 0, result.output
    canary = json.loads((out / "report.json").read_text())["canary"]
    assert canary["status"] == "measured", canary
    assert canary["settings"]["model.dtype"] == "bfloat16"
    assert canary["reference"]["model.dtype"] == "float32"
    # the canary's time is a band of its own, never generation's (nor its tokens/s)
    report = json.loads((out / "report.json").read_text())
    t, span = report["time_s"], report["timeline"]["canary"]
    assert t["canary"] == pytest.approx(span["ended_s"] - span["began_s"], abs=0.05)
    before = t["prepare"] + t["plan"] + t["engine_startup"] - t["startup_during_plan"]
    assert before + t["canary"] + t["generate"] + t["wrap_up"] == pytest.approx(t["total"], abs=0.1)
    # float32 weights of a bf16 model, or auto: nothing narrower, nothing to measure
    from nightshift.jobs.reference import answer_changing

    for model, dtype in ((models["chat"], "float32"), (wide, "auto")):
        plain = spec_dict(model, "i", "o")
        plain = validate_spec({**plain, "model": {**plain["model"], "dtype": dtype}})
        assert "model.dtype" not in answer_changing(plain)
