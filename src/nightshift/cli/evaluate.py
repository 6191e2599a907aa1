"""``nightshift jobs eval``: score a finished output against a held-out label file.

A private eval set never goes into the job's input: its labels are joined to the
committed answers on the id afterwards, and scored exactly as the report's ``quality``
is (``evaluation.quality``), so the same labels give the same figures. The figures are
printed and written to OUTPUT/eval.json, beside report.json.
"""

from __future__ import annotations

import json

import typer

from nightshift.cli.jobs import user_errors


@user_errors
def evaluate(
    output: str = typer.Argument(..., help="A job's output.path (directory or s3:// prefix)."),
    labels: str = typer.Option(
        ..., "--labels", help="Parquet file (or glob, directory, s3://) of held-out labels."
    ),
    id_column: str = typer.Option(
        ..., "--id-column", help="The labels file's id column, matched to the output's ids."
    ),
    label_column: str = typer.Option(
        None, "--label-column", help="classify: the labels file's column of true labels."
    ),
    reference_column: str = typer.Option(
        None,
        "--reference-column",
        help="extract: the column of reference JSON; generate: of reference text.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Score a finished job's answers against held-out labels, joined on the id.

    Accuracy, macro F1 and the confusion matrix (classify), valid JSON and per-field
    exact match (extract), exact match and chrF (generate). Writes OUTPUT/eval.json.

    Example:

      nightshift jobs eval out/classify-tickets --labels gold.parquet \
          --id-column ticket_id --label-column label
    """
    from nightshift.evaluation.quality import evaluate_output
    from nightshift.reports.quality import quality_summary_lines, quality_table_lines

    figures = evaluate_output(output, labels, id_column, label_column, reference_column)
    if as_json:
        typer.echo(json.dumps(figures, indent=2))
        return
    for line in quality_table_lines(figures):
        typer.echo(line)
    if figures["labels_not_in_output"]:
        typer.echo(
            f"{figures['labels_not_in_output']:,} label(s) name an id the output does not hold"
        )
    for line in quality_summary_lines({"quality": figures}, cost=False):
        typer.echo(line)
    typer.echo(f"wrote {figures['written_to']}")


def register(jobs_app: typer.Typer) -> None:
    jobs_app.command("eval")(evaluate)
