"""Quality in the report, through ``nightshift jobs run`` on the fake engine, and
``jobs eval`` against a held-out label file: the same figures as an independent count
over ``jobs export``'s rows."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.demo.tickets import tickets
from nightshift.reports.chart import chart_png_bytes

from .conftest import spec_dict, write_records

runner = CliRunner()
LABELS = ["billing", "bug", "feature_request", "account", "other"]


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def labelled(tmp_path):
    """60 tickets with a true label each (every 7th none, one outside the label set),
    and two too long to run (rejected, labelled)."""
    rows = []
    for i, t in enumerate(tickets(60, seed=5)):
        truth = None if i % 7 == 3 else LABELS[(i * 3) % len(LABELS)]
        rows.append({**t, "body": t["body"][:800], "true_label": truth})
    rows[10]["true_label"] = "spam"  # a true label the model cannot give
    for row in rows[:2]:
        row["body"] = "word " * 3000  # over model.max_model_len: rejected
    return write_records(tmp_path / "in" / "tickets.parquet", rows), rows


def run_job(models, input_path, out, write_spec, *more: str, **sections):
    spec = write_spec(spec_dict(models["chat"], input_path, out, **sections))
    result = invoke("jobs", "run", str(spec), "--set", "run.engine=fake", "-q", *more)
    return result, json.loads((out / "report.json").read_text())


def exported(out, tmp_path) -> pl.DataFrame:
    invoke("jobs", "export", str(out), str(tmp_path / "all.parquet"))
    return pl.read_parquet(tmp_path / "all.parquet")


def test_report_accuracy_equals_a_count_over_the_exported_rows(
    models, labelled, tmp_path, write_spec
):
    input_path, rows = labelled
    out = tmp_path / "out"
    result, report = run_job(
        models, input_path, out, write_spec, eval={"label_column": "true_label"}
    )
    q = report["quality"]
    rows_out = exported(out, tmp_path)
    assert "true_label" in rows_out.columns  # kept with its record, for anyone to check
    scored = rows_out.filter(pl.col("true_label").is_not_null())
    correct = scored.filter(pl.col("label") == pl.col("true_label")).height
    assert q["accuracy"] == pytest.approx(correct / scored.height)
    assert q["correct"] == correct and q["records"]["answered"] == scored.height
    assert q["records"]["rejected"] == 2 and q["records"]["failed"] == 0
    assert q["records"]["unlabelled"] == sum(r["true_label"] is None for r in rows)
    assert q["coverage"] == pytest.approx(scored.height / (scored.height + 2))
    assert sum(map(sum, q["confusion"]["matrix"])) == scored.height
    assert q["confusion"]["labels"] == [*LABELS, "spam"]
    usd = report["cost"]["usd_total"]
    assert q["usd_per_1000_correct"] == pytest.approx(usd / correct * 1000)
    assert f"quality: accuracy {q['accuracy']:.1%}" in result.output
    assert "per 1,000 correct answers" in result.output
    page = (out / "report.md").read_text()
    assert "## Quality" in page and "### Confusion matrix" in page and "| spam |" in page


def test_jobs_eval_on_held_out_labels_gives_the_reports_figures(
    models, labelled, tmp_path, write_spec
):
    input_path, rows = labelled
    out = tmp_path / "out"
    _, report = run_job(models, input_path, out, write_spec, eval={"label_column": "true_label"})
    held_out = write_records(
        tmp_path / "private" / "labels.parquet",
        [{"id": r["ticket_id"], "truth": r["true_label"]} for r in rows]
        + [{"id": "not-in-the-output", "truth": "bug"}],
    )
    result = invoke(
        "jobs", "eval", str(out), "--labels", str(held_out),
        "--id-column", "id", "--label-column", "truth",
    )  # fmt: skip
    assert "accuracy" in result.output and "Confusion matrix" in result.output
    figures = json.loads((out / "eval.json").read_text())
    assert figures["labels_not_in_output"] == 1
    for key in ("accuracy", "macro_f1", "per_label", "confusion", "records", "coverage"):
        assert figures[key] == report["quality"][key], key
    assert figures["usd_per_1000_correct"] == pytest.approx(
        report["quality"]["usd_per_1000_correct"]
    )
    spec = str(tmp_path / "job.yaml")
    invoke("jobs", "run", spec, "--set", "run.engine=fake", "-q", "--overwrite")
    assert not (out / "eval.json").exists()  # nightshift's file: replaced with the run


def test_a_resumed_run_that_adds_eval_scores_the_whole_output(
    models, labelled, tmp_path, write_spec
):
    input_path, rows = labelled
    out = tmp_path / "out"
    _, first = run_job(models, input_path.parent, out, write_spec)
    assert "quality" not in first
    new = [{**r, "ticket_id": f"new-{r['ticket_id']}", "body": "short"} for r in rows[:5]]
    write_records(input_path.parent / "more.parquet", new)  # new records: an increment
    _, report = run_job(
        models, input_path.parent, out, write_spec, eval={"label_column": "true_label"}
    )  # same fingerprint: resumed, the first run's answers not generated again
    assert report["this_run"]["records_answered"] == 5
    q = report["quality"]
    assert q["source"].startswith("input")  # the plan predates eval: joined from the input
    answered = exported(out, tmp_path)
    truth = pl.DataFrame({"ticket_id": [r["ticket_id"] for r in rows + new],
                          "t": [r["true_label"] for r in rows + new]})  # fmt: skip
    scored = answered.join(truth, on="ticket_id").filter(pl.col("t").is_not_null())
    assert q["records"]["answered"] == scored.height == 65 - 2 - q["records"]["unlabelled"]
    assert q["correct"] == scored.filter(pl.col("label") == pl.col("t")).height


def test_generate_scores_exact_match_and_chrf(models, tmp_path, write_spec):
    rows = [{"ticket_id": str(i), "subject": f"s{i}", "body": "b", "ref": "v1"} for i in range(8)]
    input_path = write_records(tmp_path / "in.parquet", rows)
    out = tmp_path / "out"
    result, report = run_job(
        models, input_path, out, write_spec,
        task={"kind": "generate"}, eval={"reference_column": "ref"},
    )  # fmt: skip
    q = report["quality"]
    answers = exported(out, tmp_path)
    exact = (answers["text"].str.strip_chars() == "v1").mean()
    assert q["exact_match_rate"] == pytest.approx(exact)
    assert 0 <= q["chrf"] <= 100 and "chrF" in result.output


def test_the_chart_gets_a_quality_panel():
    samples = [
        {"t_s": t, "records": 10 * t, "prompt_tokens": 100 * t, "output_tokens": 5 * t}
        for t in range(3)
    ]
    report = {
        "job": "j",
        "timeline": {"samples": samples},
        "time_s": {"plan": 0.5},
        "quality": {
            "kind": "classify",
            "accuracy": 0.5,
            "macro_f1": 0.4,
            "records": {"answered": 4},
            "confusion": {"labels": ["a", "b"], "matrix": [[1, 1], [1, 1]]},
        },
    }
    with_panel = chart_png_bytes(report)
    without = chart_png_bytes({k: v for k, v in report.items() if k != "quality"})
    assert with_panel and without and with_panel != without


def test_extract_scores_fields_against_a_json_reference(models, tmp_path, write_spec):
    rows = [
        {"ticket_id": str(i), "subject": f"s{i}", "body": "b", "ref": '{"a": "v1"}'}
        for i in range(8)
    ]
    input_path = write_records(tmp_path / "in.parquet", rows)
    out = tmp_path / "out"
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    _, report = run_job(
        models, input_path, out, write_spec,
        task={"kind": "extract", "schema": schema}, eval={"reference_column": "ref"},
    )  # fmt: skip
    q = report["quality"]
    answers = exported(out, tmp_path)
    matches = sum(json.loads(t)["a"] == "v1" for t in answers["json"].to_list())
    assert q["valid_json_rate"] == 1.0 and q["records"]["answered"] == 8
    assert q["per_field"]["a"]["matches"] == matches == q["correct"]


def test_a_struct_reference_scores_as_its_json_text(models, tmp_path, write_spec):
    """A Parquet struct has every field in every row: a field a reference leaves out
    reads back as null, and is absent, not a value the answer must match."""
    import pyarrow as pa

    rows = [
        {"ticket_id": str(i), "subject": f"s{i}", "body": f"ticket {i}",
         "text_ref": json.dumps({"a": a}), "struct_ref": {"a": a, "note": None}}
        for i, a in enumerate("xyz" * 10)
    ]  # fmt: skip
    struct = pa.struct([("a", pa.string()), ("note", pa.string())])
    schema = pa.schema([(k, pa.string()) for k in ("ticket_id", "subject", "body", "text_ref")])
    input_path = write_records(
        tmp_path / "in.parquet", rows, schema.append(pa.field("struct_ref", struct))
    )
    out = tmp_path / "out"
    extract = {"type": "object", "properties": {"a": {"enum": ["x", "y", "z"]}}, "required": ["a"]}
    run_job(models, input_path, out, write_spec, task={"kind": "extract", "schema": extract})
    figures = {}
    for column in ("text_ref", "struct_ref"):
        result = invoke("jobs", "eval", str(out), "--labels", str(input_path), "--id-column",
                        "ticket_id", "--reference-column", column, "--json")  # fmt: skip
        figures[column] = json.loads(result.output)
    text, struct_figures = figures["text_ref"], figures["struct_ref"]
    assert 0 < text["exact_match_rate"] < 1  # some right, some wrong: a figure to keep
    assert struct_figures["exact_match_rate"] == text["exact_match_rate"]
    assert set(struct_figures["per_field"]) == {"a"}  # no phantom "note" field
    printed = invoke("jobs", "eval", str(out), "--labels", str(input_path), "--id-column",
                     "ticket_id", "--reference-column", "struct_ref").output  # fmt: skip
    [line] = [x for x in printed.splitlines() if "correct of all labelled" in x]
    share = f"{text['accuracy_of_labelled']:.1%}"
    assert share in line and "failed and rejected records counted as not correct" in line
