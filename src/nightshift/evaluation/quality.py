"""Quality of a job's output: the report's ``quality`` section and ``jobs eval``.

Both score the same frames with the same function (``evaluation.score.score``), so a
held-out label file that holds the same labels as the input gives the same figures.
"""

from __future__ import annotations

from typing import Any

from nightshift.errors import NightshiftError, UserError
from nightshift.evaluation.read import (
    Target,
    committed_frames,
    join_labels,
    output_target,
    read_labels,
    write_eval,
)
from nightshift.evaluation.score import score, with_cost
from nightshift.io.outputs import JobOutput
from nightshift.jobs.evalspec import EVAL_KEY
from nightshift.jobs.spec import JobSpec


def report_quality(spec: JobSpec, output: JobOutput, usd_total: float) -> dict[str, Any] | None:
    """The report's ``quality`` for a spec with ``eval``, over every committed record.
    The true values come from the results (the eval column is kept); a plan made before
    ``eval`` was set lacks them, and they are joined from the input by id instead. A
    failure to score is reported in the section, never fails the run's report."""
    if spec.eval is None:
        return None
    column = spec.eval.column
    head = {"key": spec.eval.key, "column": column}
    try:
        target = Target(kind_of(spec), labels_of(spec), spec.input.id_column)
        frames = committed_frames(output, target, column)
        source = "results"
        if not frames.has_truth:
            labels = read_labels(
                spec.input.path, spec.input.id_column, column, spec.output.path, spec.eval.key
            )
            frames, _ = join_labels(frames, labels)
            source = "input, joined on the id (the plan predates eval)"
        figures = score(target.kind, target.labels, frames.ok, frames.failed, frames.rejected)
    except (NightshiftError, OSError) as exc:
        return {**head, "error": str(exc)}
    return with_cost({**head, "source": source, **figures}, usd_total)


def kind_of(spec: JobSpec) -> str:
    return spec.task.kind


def labels_of(spec: JobSpec) -> list[str]:
    return list(getattr(spec.task, "labels", []) or [])


def evaluate_output(
    location: str,
    labels_path: str,
    id_column: str,
    label_column: str | None,
    reference_column: str | None,
) -> dict[str, Any]:
    """Score a finished output against a held-out label file joined on the id; write
    the figures to OUTPUT/eval.json (``figures["written_to"]``)."""
    output = JobOutput(location)
    target = output_target(output)
    column = _column_for(target.kind, label_column, reference_column)
    labels = read_labels(labels_path, id_column, column)
    frames, missing = join_labels(committed_frames(output, target, None), labels)
    figures = score(target.kind, target.labels, frames.ok, frames.failed, frames.rejected)
    report = output.report() or {}
    usd = (report.get("cost") or {}).get("usd_total")
    result = {
        "output": location,
        "labels": labels_path,
        "id_column": id_column,
        "column": column,
        "source": f"{labels_path}, joined on {id_column}",
        "labels_not_in_output": missing,
        **figures,
    }
    result = with_cost(result, usd)
    result["written_to"] = write_eval(output, result)
    return result


def _column_for(kind: str, label_column: str | None, reference_column: str | None) -> str:
    """The column that scores ``kind``: classify by labels, extract and generate by a
    reference."""
    by_label = EVAL_KEY[kind] == "label_column"
    wanted, other = (
        (label_column, reference_column) if by_label else (reference_column, label_column)
    )
    flag, other_flag = ("--label-column", "--reference-column")[:: 1 if by_label else -1]
    if other is not None:
        raise UserError(f"{other_flag}: does not score task.kind {kind}; use {flag}")
    if wanted is None:
        raise UserError(f"{flag}: this output ran task.kind {kind}; name the column with {flag}")
    return wanted
