"""The demo tickets' ground truth, and the first-token trap of classify labels."""

from __future__ import annotations

import json

import polars as pl
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.demo.tickets import LABEL_COLUMN, LABELS, tickets, write_tickets
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.jobs.columns import OUTPUT_COLUMNS
from nightshift.jobs.tasks import shared_first_tokens

from .conftest import spec_dict

runner = CliRunner()


def test_every_ticket_has_a_true_label_in_a_column_nightshift_does_not_write(tmp_path):
    frame = pl.read_parquet(write_tickets(tmp_path, count=2000, files=4))
    assert LABEL_COLUMN not in OUTPUT_COLUMNS  # kept beside the answers, never clashing
    assert set(frame[LABEL_COLUMN].unique()) == set(LABELS)
    counts = frame[LABEL_COLUMN].value_counts()["count"]
    assert counts.min() > 400  # roughly balanced: accuracy of 1/len(LABELS) is chance
    # Several phrasings per category: no one body makes up much of a label's tickets.
    assert frame.group_by(LABEL_COLUMN).agg(pl.col("body").n_unique())["body"].min() > 300


def test_the_label_is_not_in_the_prompt_columns():
    for row in tickets(200):
        assert row[LABEL_COLUMN] not in (row["subject"], row["body"])


def _encoder(models) -> PromptEncoder:
    return PromptEncoder.load(str(models["chat"]))


def test_labels_that_can_start_with_one_token_are_found(models):
    encode = _encoder(models).encode_texts
    groups = shared_first_tokens(["billing", "bug", "account", "other"], lambda t: encode([t])[0])
    assert [members for _, members in groups] == [["billing", "bug"]]
    assert groups[0][0].startswith("b")
    assert shared_first_tokens(list(LABELS), lambda t: encode([t])[0]) == []


def test_jobs_plan_warns_naming_the_labels_that_share_a_first_token(
    models, ticket_dir, tmp_path, write_spec
):
    spec = write_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"))
    result = runner.invoke(app, ["jobs", "plan", str(spec)])
    assert result.exit_code == 0, result.output
    assert "warning: task.labels: billing, bug can all start with the token" in result.output
    as_json = json.loads(runner.invoke(app, ["jobs", "plan", str(spec), "--json"]).output)
    assert len(as_json["warnings"]) == 1 and "billing, bug" in as_json["warnings"][0]

    task = {"kind": "classify", "labels": list(LABELS)}
    distinct = write_spec(
        spec_dict(models["chat"], ticket_dir, tmp_path / "o2", task=task), "d.yaml"
    )
    result = runner.invoke(app, ["jobs", "plan", str(distinct)])
    assert result.exit_code == 0 and "warning" not in result.output
