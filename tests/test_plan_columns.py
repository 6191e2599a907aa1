"""Input columns named like the plan's own columns are ordinary columns (DESIGN invariant 8).

Each case runs a job whose template and kept columns use a column named like one the plan
keeps internally, and a clean twin where that column has a neutral name. The prompts are
the same text, so the fake engine gives each record the same answer in both; every
record's answer, kept value and shard size must match the clean run.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.io.planstore import reject_column_names
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records

RECORDS = 23
SHARD = 5
NEUTRAL = "candidate"


def values(kind: str) -> list:
    """Column values that disagree with whatever the plan would put in its own column."""
    if kind == "int":
        return [(7 * i) % 11 for i in range(RECORDS)]  # repeats, out of order
    if kind == "small":
        return [i % 2 for i in range(RECORDS)]  # as a shard number: 0 and 1 only
    return [f"role {(RECORDS - i) % 6}" for i in range(RECORDS)]


def write_input(root: Path, column: str, kind: str) -> Path:
    rows = [
        {"rid": f"r{i:02d}", column: v, "body": f"experience {i} " + "word " * (i % 7)}
        for i, v in enumerate(values(kind))
    ]
    rows[4]["body"] = None  # one reject, which must keep the column too
    write_records(root / "a.parquet", rows[:11])
    write_records(root / "b.parquet", rows[11:])
    return root


def run(models, tmp_path: Path, column: str, kind: str, id_column: str = "rid") -> dict:
    name = f"{column}-{kind}-{id_column}"
    input_path = write_input(tmp_path / name / "in", column, kind)
    if id_column != "rid":  # the id column itself takes the internal name
        for path in input_path.glob("*.parquet"):
            frame = pl.read_parquet(path).rename({"rid": id_column})
            frame.write_parquet(path)
    out = tmp_path / name / "out"
    spec = spec_dict(
        models["chat"],
        input_path,
        out,
        input={"path": str(input_path), "id_column": id_column, "keep_columns": [column]},
        prompt={"template": f"Summarise the candidate for {{{column}}}: {{body}}"},
        task={"kind": "generate"},
        plan={"shard_records": SHARD},
    )
    outcome = run_job(validate_spec(spec), engine=FakeEngine(), progress=False)
    assert outcome.report["records"]["ok"] == RECORDS - 1
    results = pl.read_parquet(sorted((out / "results").glob("*.parquet")))
    plan = json.loads((out / "plan" / "plan.json").read_text())
    return {
        "results": results.rename({id_column: "id", column: "value"}).sort("id"),
        "rejects": pl.read_parquet(out / "rejects.parquet"),
        "shards": [s["records"] for s in plan["shards"]["each"]],
        "each": plan["shards"]["each"],
        "committed": sorted(
            json.loads(m.read_text())["records"]["planned"] for m in (out / "committed").iterdir()
        ),
        "out": out,
    }


CASES = [
    ("position", "str"),
    ("position", "int"),
    ("shard", "small"),
    ("_row", "int"),
    ("_file", "small"),
    ("tokens", "int"),
    ("record_id", "str"),
    ("exact", "small"),
    ("predicted_cached", "int"),
    ("h1", "int"),
    ("p0", "int"),
    ("reason", "str"),
    ("reject_kind", "str"),
]


@pytest.fixture(scope="module")
def clean(models, tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("clean")
    return {kind: run(models, root, NEUTRAL, kind) for kind in ("str", "int", "small")}


@pytest.mark.parametrize(("column", "kind"), CASES)
def test_a_column_named_like_a_plan_column_runs_like_any_other(
    models, tmp_path, clean, column, kind
):
    job, twin = run(models, tmp_path, column, kind), clean[kind]
    # Every record keeps its own value and gets the answer its own prompt gets.
    assert (
        job["results"]
        .select("id", "value", "text")
        .equals(twin["results"].select("id", "value", "text"))
    )
    assert job["results"]["value"].to_list() == [v for i, v in enumerate(values(kind)) if i != 4]
    assert job["each"] == twin["each"]  # sizes, prompt tokens, predicted reuse
    assert max(job["shards"]) == SHARD
    assert job["committed"] == sorted(twin["shards"])
    # The reject keeps the input column under its own name, untouched.
    rejects = job["rejects"]
    assert rejects[column].to_list() == [values(kind)[4]]
    reason, kind_column = reject_column_names([column])
    assert rejects[kind_column].to_list() == ["null_field"]
    assert rejects[reason].to_list() == ["field 'body' is null"]


@pytest.mark.parametrize("id_column", ["position", "record_id", "_row", "shard", "_at", "_part"])
def test_an_id_column_named_like_a_plan_column_matches_its_records(
    models, tmp_path, clean, id_column
):
    job = run(models, tmp_path, "notes", "str", id_column=id_column)
    twin = clean["str"]
    assert job["results"]["id"].to_list() == twin["results"]["id"].to_list()
    assert job["results"]["text"].to_list() == twin["results"]["text"].to_list()
    assert job["shards"] == twin["shards"]


def test_a_rerun_resumes_a_plan_with_such_columns(models, tmp_path):
    """The plan with a `position` column is sound, so a rerun finds everything done."""
    job = run(models, tmp_path, "position", "int")
    spec = validate_spec(
        spec_dict(
            models["chat"],
            job["out"].parent / "in",
            job["out"],
            input={
                "path": str(job["out"].parent / "in"),
                "id_column": "rid",
                "keep_columns": ["position"],
            },
            prompt={"template": "Summarise the candidate for {position}: {body}"},
            task={"kind": "generate"},
            plan={"shard_records": SHARD},
        )
    )
    again = run_job(spec, engine=FakeEngine(), progress=False)
    assert again.report["records"]["ok"] == RECORDS - 1


def test_rejects_name_their_own_columns_around_the_input_columns():
    assert reject_column_names(["body"]) == ("reason", "reject_kind")
    assert reject_column_names(["reason"]) == ("nightshift_reason", "reject_kind")
    taken = ["reason", "nightshift_reason", "reject_kind"]
    assert reject_column_names(taken) == ("_nightshift_reason", "nightshift_reject_kind")


@pytest.mark.parametrize(("column", "kind"), [("position", "int"), ("shard", "small")])
def test_shard_files_hold_the_input_columns_unchanged_in_run_order(models, tmp_path, column, kind):
    job = run(models, tmp_path, column, kind)
    planned = pl.read_parquet(job["out"] / "plan" / "records.parquet")
    inputs = pl.read_parquet(sorted((job["out"].parent / "in").glob("*.parquet")))
    for (shard,), keys in planned.group_by("shard"):
        path = job["out"] / "plan" / "shards" / f"shard-{shard:05d}.parquet"
        frame = pl.from_arrow(pq.read_table(path))
        assert frame["rid"].to_list() == keys.sort("position")["record_id"].to_list()
        expected = inputs.join(frame.select("rid"), on="rid", maintain_order="right")
        assert frame.select(inputs.columns).equals(expected.select(inputs.columns))


def test_the_one_reserved_name_is_refused_before_planning(models, tmp_path):
    from nightshift.errors import SpecError
    from nightshift.io.planstore import POSITION

    root = write_records(tmp_path / "in" / "a.parquet", [{"rid": "r", POSITION: "x", "body": "b"}])
    spec = spec_dict(
        models["chat"],
        root,
        tmp_path / "out",
        input={"path": str(root), "id_column": "rid", "keep_columns": [POSITION]},
        prompt={"template": "{body}"},
        task={"kind": "generate"},
    )
    with pytest.raises(SpecError, match=POSITION) as caught:
        run_job(validate_spec(spec), engine=FakeEngine(), progress=False)
    assert caught.value.key == "input.keep_columns"
    assert not (tmp_path / "out" / "plan" / "plan.json").exists()
