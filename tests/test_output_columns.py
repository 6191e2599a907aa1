"""Input columns named like the columns nightshift writes: refused, or kept under their name.

Every name the results and failed tables add (``jobs.columns.written_fields``) is refused
as an id or kept column, with a message naming the key and the fix; names nightshift
uses elsewhere (rejects' reason and kind, the plan's keys) work and keep their values
through ``jobs run`` and ``jobs export``.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.io.outputs import JobOutput, committed_files
from nightshift.jobs.columns import DETAIL_COLUMNS, OUTPUT_COLUMNS

from .conftest import spec_dict, write_records
from .durable import read_table

runner = CliRunner()


def _input(tmp_path, extra: list[str], rows: int = 12, long_body: bool = False):
    data = [
        {
            "ticket_id": f"t{i}",
            "subject": f"s{i % 4}",
            "body": ("word " * 3000) if long_body and i == 0 else f"body {i}",
            **{name: f"{name}-{i}" for name in extra},
        }
        for i in range(rows)
    ]
    return write_records(tmp_path / "in" / "p.parquet", data)


def _run(spec_path, *more: str):
    return runner.invoke(
        app, ["jobs", "run", str(spec_path), "--set", "run.engine=fake", "-q", *more]
    )


def _spec(models, tmp_path, write_spec, **input_keys) -> dict:
    data = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out", plan={"shard_records": 5})
    data["input"].update(input_keys)
    return data


@pytest.mark.parametrize("role", ["id"])  # a kept one is written as input_<name>: below
@pytest.mark.parametrize("name", sorted(OUTPUT_COLUMNS))
def test_every_column_nightshift_writes_is_refused_as_an_input_column(
    models, tmp_path, write_spec, name, role
):
    _input(tmp_path, [name])
    keys = {"keep_columns": ["subject", name]} if role == "keep" else {"id_column": name}
    result = _run(write_spec(_spec(models, tmp_path, write_spec, **keys)))
    assert result.exit_code == 2, result.output
    key = "input.keep_columns" if role == "keep" else "input.id_column"
    assert key in result.output and name in result.output and "rename" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "plan").exists()  # refused before anything ran


@pytest.mark.parametrize("role", ["id"])
@pytest.mark.parametrize("name", sorted(DETAIL_COLUMNS))
def test_with_a_sampling_column_its_detail_column_is_refused_too(
    models, tmp_path, write_spec, name, role
):
    _input(tmp_path, [name, "own"])
    keys = {"keep_columns": ["subject", name]} if role == "keep" else {"id_column": name}
    result = _run(write_spec(_spec(models, tmp_path, write_spec, sampling_column="own", **keys)))
    assert result.exit_code == 2, result.output
    assert "input" in result.output and name in result.output and "rename" in result.output


def test_a_kept_column_named_like_an_output_column_is_written_as_input_name(
    models, tmp_path, write_spec
):
    """keep_columns: [text] beside the answer's text: the answer keeps its name, the
    user's column is input_text, for every name nightshift writes (repeats answered from
    another record included)."""
    names = sorted((OUTPUT_COLUMNS | DETAIL_COLUMNS) - {"ticket_id"})
    rows = [
        {"ticket_id": f"t{i}", "subject": "s", "body": f"body {i % 4}", "own": "{}",
         **{name: f"{name}-{i}" for name in names}}
        for i in range(12)
    ]  # fmt: skip
    write_records(tmp_path / "in" / "p.parquet", rows)
    data = _spec(models, tmp_path, write_spec, sampling_column="own", keep_columns=names)
    data["task"] = {"kind": "generate"}
    result = _run(write_spec(data))
    assert result.exit_code == 0, result.output
    out = str(tmp_path / "out")
    written = [read_table(JobOutput(out), uri) for uri in committed_files(out, "results")]
    got = {r["ticket_id"]: r for t in written for r in t.to_pylist()}
    assert len(got) == 12 and any(r["answered_from"] for r in got.values())  # copies too
    for record_id, row in got.items():
        i = int(record_id[1:])
        assert all(row[f"input_{name}"] == f"{name}-{i}" for name in names), row
        assert row["text"] != f"text-{i}" and row["finish_reason"] != f"finish_reason-{i}"


def test_two_kept_columns_written_under_one_name_are_refused(models, tmp_path, write_spec):
    _input(tmp_path, ["text", "input_text"])
    keys = {"keep_columns": ["text", "input_text"]}
    result = _run(write_spec(_spec(models, tmp_path, write_spec, **keys)))
    assert result.exit_code == 2, result.output
    assert "input.keep_columns: input_text would be written twice" in result.output


def _written_columns(location: str) -> set[str]:
    output, names = JobOutput(location), set()
    for kind in ("results", "failed"):
        for uri in committed_files(location, kind):
            names.update(read_table(output, uri).schema.names)
    return names


@pytest.mark.parametrize("kind", ["classify", "extract", "generate"])
def test_every_column_a_run_writes_is_an_input_column_or_a_refused_name(
    models, tmp_path, write_spec, kind
):
    """Read back what a run wrote (a sampling column, so the detail column too): any
    column that is not the id or a kept one must be in the refused set, so a writer that
    gains a column without it fails here."""
    _input(tmp_path, ["own"])
    tasks = {
        "classify": {"kind": "classify", "labels": ["billing", "bug"]},
        "extract": {"kind": "extract", "schema": {"type": "object", "properties": {}}},
        "generate": {"kind": "generate"},
    }
    data = _spec(models, tmp_path, write_spec, sampling_column="own")
    data["task"] = tasks[kind]
    # An answer cut at 1 token is no valid JSON: extract jobs write failed rows too.
    data["sampling"] = {"max_tokens": 1 if kind == "extract" else 8}
    write_records(
        tmp_path / "in" / "p.parquet",
        [{"ticket_id": f"t{i}", "subject": "s", "body": f"b{i}", "own": "{}"} for i in range(6)],
    )
    result = _run(write_spec(data))
    assert result.exit_code in (0, 1), result.output  # 1: some records failed
    ours = _written_columns(str(tmp_path / "out")) - {"ticket_id", "subject"}
    assert ours and ours <= OUTPUT_COLUMNS | DETAIL_COLUMNS, ours - OUTPUT_COLUMNS


# Names nightshift uses outside the results' columns: rejects.parquet's own two (renamed
# around the input's) and the plan's keys (which never share a frame with the input).
OTHER_NAMES = ["reason", "reject_kind", "nightshift_reason", "record_id", "shard", "position"]


def test_names_nightshift_uses_elsewhere_keep_the_users_values_through_export(
    models, tmp_path, write_spec
):
    _input(tmp_path, OTHER_NAMES, long_body=True)  # t0 is over the context: rejected
    data = _spec(models, tmp_path, write_spec, keep_columns=["subject", *OTHER_NAMES])
    data["model"]["max_model_len"] = 512
    result = _run(write_spec(data))
    assert result.exit_code == 0, result.output
    exported = tmp_path / "all.parquet"
    result = runner.invoke(app, ["jobs", "export", str(tmp_path / "out"), str(exported)])
    assert result.exit_code == 0, result.output
    rows = pq.read_table(exported).to_pylist()
    assert sorted(r["ticket_id"] for r in rows) == sorted(f"t{i}" for i in range(1, 12))
    for row in rows:
        i = row["ticket_id"][1:]
        assert {n: row[n] for n in OTHER_NAMES} == {n: f"{n}-{i}" for n in OTHER_NAMES}
    [reject] = pq.read_table(tmp_path / "out" / "rejects.parquet").to_pylist()
    assert {n: reject[n] for n in OTHER_NAMES} == {n: f"{n}-0" for n in OTHER_NAMES}
    assert reject["_nightshift_reason"] and reject["nightshift_reject_kind"] == "over_length"
    assert json.loads((tmp_path / "out" / "report.json").read_text())["records"]["rejected"] == 1


def test_an_id_column_named_like_a_plan_key_keeps_its_values(models, tmp_path, write_spec):
    """The id column takes a name the plan uses for its own keys."""
    _input(tmp_path, ["record_id"])
    data = _spec(models, tmp_path, write_spec, id_column="record_id")
    assert _run(write_spec(data)).exit_code == 0
    ids = []
    for uri in committed_files(str(tmp_path / "out"), "results"):
        ids += read_table(JobOutput(str(tmp_path / "out")), uri).column("record_id").to_pylist()
    assert sorted(ids) == sorted(f"record_id-{i}" for i in range(12))


def test_schema_helpers_agree_with_the_result_tables():
    """``ResultTables`` builds its schemas from the same list the spec refuses."""
    from nightshift.jobs.spec import ClassifyTask
    from nightshift.jobs.tasks import handler_for
    from nightshift.running.results import ResultTables

    schema = pa.schema([pa.field("id", pa.string()), pa.field("keep", pa.int64())])
    task = handler_for(ClassifyTask(kind="classify", labels=["a", "b"]))
    tables = ResultTables(schema, "id", ["keep"], task, detail=True)
    for table in (tables.results, tables.failed):
        assert set(table.names) - {"id", "keep"} <= OUTPUT_COLUMNS | DETAIL_COLUMNS
