"""The CLI: jobs run and plan on a small dataset, and each documented bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nightshift.cli import app

from .conftest import spec_dict, write_records

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def spec_path(models, ticket_dir, tmp_path, write_spec):
    return write_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"))


def assert_user_error(result, *fragments: str):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output


def test_run_with_the_fake_engine_writes_results_and_report(spec_path, tmp_path):
    result = invoke("jobs", "run", str(spec_path), "--set", "run.engine=fake", "-q")
    assert result.exit_code == 0, result.output
    assert "120 ok, 0 rejected, 0 failed of 120 records" in result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["records"]["ok"] == 120
    assert "cost: $" in result.output and "report.json" in result.output


def test_plan_reports_records_tokens_and_over_length(models, tmp_path, write_spec):
    rows = [
        {"ticket_id": str(i), "subject": f"s{i}", "body": "word " * (10 if i else 3000)}
        for i in range(5)
    ]
    write_records(tmp_path / "in.parquet", rows)
    spec = write_spec(
        spec_dict(
            models["chat"],
            tmp_path / "in.parquet",
            tmp_path / "out",
            cost={"usd_per_gpu_hour": 3.6, "expected_tokens_per_s": 1000.0},
        )
    )
    result = invoke("jobs", "plan", str(spec), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["records"] == {"input": 5, "runnable": 4, "rejected": 1, "over_length": 1}
    tokens = summary["tokens"]["prompt"] + summary["tokens"]["output_at_most"]
    assert summary["projection"]["usd"] == pytest.approx(tokens / 1000 / 3600 * 3.6)
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_plan_text_says_how_to_get_a_projection(spec_path):
    result = invoke("jobs", "plan", str(spec_path))
    assert result.exit_code == 0, result.output
    assert "120 records, 120 runnable" in result.output
    assert "cost.expected_tokens_per_s" in result.output


def test_unknown_key(spec_path):
    result = invoke("jobs", "plan", str(spec_path), "--set", "sampling.temprature=0.2")
    assert_user_error(
        result, "sampling.temprature: unknown key", "did you mean sampling.temperature?"
    )


def test_missing_key(models, ticket_dir, tmp_path, write_spec):
    data = spec_dict(models["chat"], ticket_dir, tmp_path / "out")
    del data["output"]
    assert_user_error(invoke("jobs", "run", str(write_spec(data))), "output: required key")


def test_wrong_type(spec_path):
    result = invoke("jobs", "run", str(spec_path), "--set", "sampling.max_tokens=lots")
    assert_user_error(result, "sampling.max_tokens", "'lots'")


def test_missing_spec_file(tmp_path):
    assert_user_error(invoke("jobs", "run", str(tmp_path / "nope.yaml")), "does not exist")


def test_input_matching_no_files(spec_path, tmp_path):
    result = invoke(
        "jobs", "plan", str(spec_path), "--set", f"input.path={tmp_path}/none/*.parquet"
    )
    assert_user_error(result, "input.path", "matches no Parquet files")


def test_template_column_not_in_input(spec_path):
    result = invoke("jobs", "plan", str(spec_path), "--set", "prompt.template=Hi {customer}")
    assert_user_error(result, "prompt.template", "'customer' is not in the input", "the input has")


def test_id_column_not_in_input(spec_path):
    result = invoke("jobs", "plan", str(spec_path), "--set", "input.id_column=id")
    assert_user_error(result, "input.id_column", "'id' is not in the input")


def test_model_that_cannot_be_loaded(spec_path, tmp_path):
    result = invoke("jobs", "plan", str(spec_path), "--set", f"model.path={tmp_path}/no-model")
    assert_user_error(result, "model.path", "does not exist", "nightshift demo init")


def test_output_that_holds_a_different_run(spec_path):
    assert invoke("jobs", "run", str(spec_path), "--set", "run.engine=fake", "-q").exit_code == 0
    again = invoke("jobs", "run", str(spec_path), "--set", "run.engine=fake", "-q")
    assert again.exit_code == 0 and "0 by this run" in again.output  # same job: resumed
    changed = ["--set", "sampling.max_tokens=4", "--set", "run.engine=fake", "-q"]
    result = invoke("jobs", "run", str(spec_path), *changed)
    assert_user_error(result, "holds a run of a different job (sampling changed)", "--new-run")


def test_input_files_that_disagree_on_types_are_named(models, tmp_path, write_spec):
    write_records(tmp_path / "in" / "a.parquet", [{"ticket_id": 1, "subject": "s", "body": "b"}])
    write_records(tmp_path / "in" / "b.parquet", [{"ticket_id": "x", "subject": "s", "body": "b"}])
    spec = write_spec(spec_dict(models["chat"], tmp_path / "in", tmp_path / "out"))
    assert_user_error(invoke("jobs", "plan", str(spec)), "input.path", "disagree on column types")


def test_a_file_that_is_not_parquet_is_named(models, tmp_path, write_spec):
    write_records(tmp_path / "in" / "a.parquet", [{"ticket_id": "1", "subject": "s", "body": "b"}])
    (tmp_path / "in" / "b.parquet").write_text("not parquet")
    spec = write_spec(spec_dict(models["chat"], tmp_path / "in", tmp_path / "out"))
    assert_user_error(invoke("jobs", "plan", str(spec)), "b.parquet is not a readable Parquet")


def test_a_column_missing_from_one_file_is_a_null_field_reject(models, tmp_path, write_spec):
    write_records(tmp_path / "in" / "a.parquet", [{"ticket_id": "1", "body": "b"}])
    write_records(tmp_path / "in" / "b.parquet", [{"ticket_id": "2", "subject": "s", "body": "b"}])
    spec = write_spec(spec_dict(models["chat"], tmp_path / "in", tmp_path / "out"))
    result = invoke("jobs", "run", str(spec), "--set", "run.engine=fake", "-q")
    assert "1 ok, 1 rejected" in result.output, result.output


def test_float_ids_are_refused(models, tmp_path, write_spec):
    write_records(tmp_path / "in.parquet", [{"ticket_id": 1.5, "subject": "s", "body": "b"}])
    spec = write_spec(spec_dict(models["chat"], tmp_path / "in.parquet", tmp_path / "out"))
    assert_user_error(invoke("jobs", "plan", str(spec)), "input.id_column", "strings or integers")


def test_output_inside_the_input_directory_is_not_read_back(models, ticket_dir, write_spec):
    spec = write_spec(spec_dict(models["chat"], ticket_dir, ticket_dir / "out"))
    args = ["jobs", "run", str(spec), "--set", "run.engine=fake", "-q"]
    assert "120 ok, 0 rejected" in invoke(*args).output
    assert "120 ok, 0 rejected" in invoke(*args, "--overwrite").output


def test_set_keeps_text_exactly_as_typed(spec_path, tmp_path):
    from nightshift.jobs.loading import load_spec

    spec = load_spec(spec_path, ["prompt.system=Use label #2 when unsure", "output.path=o #3"])
    assert spec.prompt.system == "Use label #2 when unsure" and spec.output.path == "o #3"


def test_duplicate_keys_and_non_utf8_specs(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("name: a\nname: b\n")
    assert_user_error(invoke("jobs", "plan", str(twice)), "name: is given twice")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert_user_error(invoke("jobs", "plan", str(binary)), "not UTF-8")


def test_engine_extra_typo_is_caught_before_planning(spec_path):
    result = invoke("jobs", "run", str(spec_path), "--set", "engine.extra.enforce_eagr=true")
    assert_user_error(result, "engine.extra.enforce_eagr", "did you mean enforce_eager")


def test_an_id_column_named_like_an_output_column_is_refused(spec_path):
    result = invoke("jobs", "plan", str(spec_path), "--set", "input.id_column=text")
    assert_user_error(result, "input.id_column", "output column")


def test_plan_does_not_project_from_a_fake_engine_run(spec_path):
    assert invoke("jobs", "run", str(spec_path), "--set", "run.engine=fake", "-q").exit_code == 0
    result = invoke("jobs", "plan", str(spec_path))
    assert "projected cost: unknown" in result.output, result.output


def _files_holding(root, text: str) -> list[str]:
    if not root.exists():
        return []
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_secret_is_refused_from_set_and_from_the_yaml(models, ticket_dir, tmp_path, write_spec):
    data = spec_dict(models["chat"], ticket_dir, tmp_path / "out")
    given = write_spec(data)
    from_set = invoke(
        "jobs", "run", str(given), "--set", "engine.extra.hf_token=hf_abc123",
        "--set", "run.engine=fake", "-q",
    )  # fmt: skip
    data["engine"]["extra"]["hf_token"] = "hf_abc123"
    from_yaml = invoke("jobs", "run", str(write_spec(data, "secret.yaml")), "-q")
    for result in (from_set, from_yaml):
        assert_user_error(result, "engine.extra.hf_token", "set HF_TOKEN in the environment")
        assert "hf_abc123" not in result.output
    assert _files_holding(tmp_path / "out", "hf_abc123") == []


def test_a_256_bit_decimal_column_is_named(models, tmp_path, write_spec):
    from decimal import Decimal

    import pyarrow as pa

    schema = pa.schema(
        [("ticket_id", pa.string()), ("subject", pa.string()), ("body", pa.string()),
         ("amount", pa.decimal256(40, 2))]
    )  # fmt: skip
    rows = [{"ticket_id": "1", "subject": "s", "body": "b", "amount": Decimal("1.50")}]
    write_records(tmp_path / "in.parquet", rows, schema)
    data = spec_dict(models["chat"], tmp_path / "in.parquet", tmp_path / "out")
    data["input"]["keep_columns"] = ["subject", "amount"]
    result = invoke("jobs", "plan", str(write_spec(data)))  # a run plans through the same code
    assert_user_error(result, "input.keep_columns", "'amount' holds decimal256(40, 2)", "cast")


def test_a_yaml_key_that_is_a_list(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\n? [a, b]\n: 1\n")
    assert_user_error(invoke("jobs", "plan", str(spec)), "the key ['a', 'b'] at line 2 is a list")


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("sampling.max_tokens=9223372036854775808", "sampling.max_tokens: 9223372036854775808"),
        ("run.lease_s=.inf", "run.lease_s: Input should be a finite number"),
    ],
)
def test_absurd_numbers_are_refused(spec_path, setting, fragment):
    result = invoke("jobs", "run", str(spec_path), "--set", setting, "--set", "run.engine=fake")
    assert_user_error(result, fragment)


def test_a_worker_id_that_cannot_name_a_file_is_refused_up_front(spec_path, tmp_path):
    result = invoke("jobs", "work", str(spec_path), "--set", "run.engine=fake", "--worker", "../x")
    assert_user_error(result, "--worker: '../x' cannot name a worker")
    assert not (tmp_path / "out").exists() and not (tmp_path / "x").exists()
