"""The whole job path on the fake engine: rejects, failures, output and report."""

from __future__ import annotations

import json

import polars as pl
import pyarrow.parquet as pq
import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.errors import OutputExistsError
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records

LABELS = ["billing", "bug", "feature_request", "account", "other"]


@pytest.fixture
def messy_input(tmp_path):
    """Good records plus each kind of bad one."""
    rows = [
        {"ticket_id": f"t{i}", "subject": f"s{i}", "body": f"body {{x}} {i}"} for i in range(30)
    ]
    rows += [
        {"ticket_id": "null-body", "subject": "s", "body": None},
        {"ticket_id": "t3", "subject": "dup", "body": "duplicate id"},
        {"ticket_id": None, "subject": "s", "body": "no id"},
        {"ticket_id": "too-long", "subject": "s", "body": "word " * 3000},
    ]
    write_records(tmp_path / "in" / "a.parquet", rows[:17])
    write_records(tmp_path / "in" / "b.parquet", rows[17:])
    return tmp_path / "in"


def run(models, input_path, out, engine=None, **sections):
    spec = validate_spec(spec_dict(models["chat"], input_path, out, **sections))
    return run_job(spec, engine=engine or FakeEngine(), progress=False)


def test_bad_records_are_set_aside_with_reasons(models, messy_input, tmp_path):
    outcome = run(models, messy_input, tmp_path / "out")
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet")
    by_kind = dict(zip(rejects["reject_kind"], rejects["ticket_id"], strict=True))
    assert by_kind == {
        "null_field": "null-body",
        "duplicate_id": "t3",
        "null_id": None,
        "over_length": "too-long",
    }
    too_long = rejects.filter(pl.col("ticket_id") == "too-long")["reason"][0]
    assert "exceeds model.max_model_len 2048" in too_long
    duplicate = rejects.filter(pl.col("reject_kind") == "duplicate_id")["reason"][0]
    assert duplicate == "duplicate ticket_id: an earlier record has it"
    # Rejects keep the input columns the job used, so they can be fixed and rerun.
    assert set(rejects.columns) >= {"ticket_id", "subject", "body", "reason"}
    records = outcome.report["records"]
    assert records == {"input": 34, "ok": 30, "rejected": 4, "failed": 0, "not_yet_run": 0}


def test_output_has_one_row_per_record_with_labels_and_counts(models, ticket_dir, tmp_path):
    outcome = run(models, ticket_dir, tmp_path / "out", plan={"shard_records": 50})
    results = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")
    assert len(list((tmp_path / "out" / "results").glob("*.parquet"))) == 3  # one per shard
    assert results.columns == [
        "ticket_id",
        "subject",
        "text",
        "label",
        "confidence",
        "finish_reason",
        "prompt_tokens",
        "output_tokens",
        "cached_tokens",
        "answered_from",  # dedup: null, no ticket repeats another's prompt
    ]
    assert results["ticket_id"].n_unique() == 120
    assert set(results["label"]) <= set(LABELS)
    tokens = outcome.report["tokens"]
    assert tokens["prompt"] == results["prompt_tokens"].sum()
    assert tokens["output"] == results["output_tokens"].sum()
    assert tokens["prompt_cached"] == results["cached_tokens"].sum() > 0


def test_per_record_engine_errors_fail_only_that_record(models, ticket_dir, tmp_path):
    unlucky = {"n": 0}

    def fail_every_tenth(ids):
        unlucky["n"] += 1
        return "out of cheese" if unlucky["n"] % 10 == 0 else None

    outcome = run(
        models, ticket_dir, tmp_path / "out", engine=FakeEngine(fail_when=fail_every_tenth)
    )
    failed = pl.read_parquet(tmp_path / "out" / "failed" / "*.parquet")
    assert len(failed) == 12 and set(failed["error"]) == {"engine: out of cheese"}
    r = outcome.report["records"]
    assert (r["ok"], r["failed"]) == (108, 12)
    assert r["input"] == r["ok"] + r["rejected"] + r["failed"]
    ok_ids = set(pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")["ticket_id"])
    assert ok_ids.isdisjoint(failed["ticket_id"]) and len(ok_ids | set(failed["ticket_id"])) == 120


def test_extract_answers_are_parsed_and_validated(models, ticket_dir, tmp_path):
    schema = {
        "type": "object",
        "properties": {"priority": {"enum": ["low", "high"]}, "refund": {"type": "boolean"}},
        "required": ["priority", "refund"],
    }
    run(
        models,
        ticket_dir,
        tmp_path / "out",
        task={"kind": "extract", "schema": schema},
        sampling={"max_tokens": 32},
    )
    results = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")
    values = [json.loads(v) for v in results["json"]]
    assert len(values) == 120 and all(v["priority"] in ("low", "high") for v in values)


def test_generate_task_has_text_and_finish_reason(models, ticket_dir, tmp_path):
    run(models, ticket_dir, tmp_path / "out", task={"kind": "generate"})
    results = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")
    assert "label" not in results.columns and (results["finish_reason"] == "length").all()
    assert (results["output_tokens"] == 8).all()


def test_a_different_job_is_not_mixed_into_an_output(models, ticket_dir, tmp_path):
    run(models, ticket_dir, tmp_path / "out")
    with pytest.raises(OutputExistsError, match=r"\(task changed\).*--overwrite"):
        run(models, ticket_dir, tmp_path / "out", task={"kind": "generate"})
    spec = spec_dict(models["chat"], ticket_dir, tmp_path / "out", task={"kind": "generate"})
    run_job(validate_spec(spec), engine=FakeEngine(), progress=False, overwrite=True)
    results = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")
    assert "label" not in results.columns and len(results) == 120


def test_output_reads_in_pyarrow_and_duckdb(models, ticket_dir, tmp_path):
    import duckdb

    from nightshift import committed_files

    run(models, ticket_dir, tmp_path / "out", plan={"shard_records": 50})
    files = committed_files(str(tmp_path / "out"))  # the README's one-liners
    assert len(files) == 3
    assert pl.read_parquet(files)["ticket_id"].n_unique() == 120
    assert pq.ParquetDataset(files).read().num_rows == 120
    [(count,)] = duckdb.read_parquet(files).aggregate("count(distinct ticket_id)").fetchall()
    assert count == 120
    parts = str(tmp_path / "out" / "results" / "*.parquet")
    [(count,)] = duckdb.sql(f"select count(distinct ticket_id) from '{parts}'").fetchall()
    assert count == 120


def test_a_job_with_nothing_runnable_starts_no_engine(models, tmp_path, monkeypatch):
    import nightshift.running.engines as runner

    def no_engine(spec):
        raise AssertionError("engine started for a job with nothing to run")

    monkeypatch.setattr(runner, "build_engine", no_engine)
    write_records(tmp_path / "in.parquet", [{"ticket_id": "a", "subject": "s", "body": None}])
    spec = validate_spec(spec_dict(models["chat"], tmp_path / "in.parquet", tmp_path / "out"))
    report = run_job(spec, progress=False).report
    assert report["records"] == {"input": 1, "ok": 0, "rejected": 1, "failed": 0, "not_yet_run": 0}
    assert report["engine"] == {}
    assert report["spec"]["input"]["path"] == str(tmp_path / "in.parquet")


def test_overwrite_replaces_nightshifts_files_and_nothing_else(models, ticket_dir, tmp_path):
    run(models, ticket_dir, tmp_path / "out")
    (tmp_path / "out" / "results" / "notes.txt").write_text("mine")
    (tmp_path / "out" / "mine.csv").write_text("a,b")
    from nightshift.io.leases import ShardLeases
    from nightshift.io.outputs import JobOutput

    store = JobOutput(str(tmp_path / "out")).store
    ShardLeases(store, "a-worker-that-died").claim(0)  # would hold shard 0 for lease_s
    spec = validate_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"))
    run_job(spec, engine=FakeEngine(), progress=False, overwrite=True)
    assert store.list("leases/") == []
    assert (tmp_path / "out" / "results" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "out" / "mine.csv").read_text() == "a,b"
    assert len(pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")) == 120


def test_output_path_that_is_a_file_is_refused_before_any_work(models, ticket_dir, tmp_path):
    from nightshift.errors import SpecError

    (tmp_path / "afile").write_text("x")
    with pytest.raises(SpecError, match="is a file") as caught:
        run(models, ticket_dir, tmp_path / "afile")
    assert caught.value.key == "output.path"


def test_keeping_the_id_column_does_not_duplicate_it(models, ticket_dir, tmp_path):
    run(
        models,
        ticket_dir,
        tmp_path / "out",
        input={
            "path": str(ticket_dir),
            "id_column": "ticket_id",
            "keep_columns": ["ticket_id", "subject"],
        },
    )
    results = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")
    assert results.columns[:3] == ["ticket_id", "subject", "text"] and len(results) == 120


def test_a_job_whose_first_records_all_fail_alike_stops(models, ticket_dir, tmp_path):
    from nightshift.errors import JobAbortedError

    engine = FakeEngine(fail_when=lambda ids: "schema cannot be compiled")
    with pytest.raises(JobAbortedError, match="first 50 records all failed with"):
        run(models, ticket_dir, tmp_path / "out", engine=engine)
    assert not (tmp_path / "out" / "report.json").exists()
