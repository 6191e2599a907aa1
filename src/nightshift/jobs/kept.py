"""The input columns a job copies into every result row: ``input.keep_columns`` and the
eval column (``jobs.evalspec``), which travels with its record but never into the prompt."""

from __future__ import annotations

from nightshift.jobs.spec import JobSpec


def eval_column(spec: JobSpec) -> str | None:
    return spec.eval.column if spec.eval is not None else None


def kept_columns(spec: JobSpec, planned: list[str] | None = None) -> list[str]:
    """The input columns copied into every result row: ``input.keep_columns`` and the
    eval column. With ``planned`` (the columns the output's plan holds) the plan decides,
    so every shard of one output has the same columns: an eval column the plan lacks (eval
    added on resume) is not kept (the report then joins it from the input), and one an
    earlier run planned stays kept after eval is dropped."""
    keep = list(spec.input.keep_columns)
    column = eval_column(spec)
    if column is not None and column not in keep and column != spec.input.id_column:
        keep.append(column)
    if planned is None:
        return keep
    used = {spec.input.id_column, *spec.template_columns(), spec.input.sampling_column}
    earlier = [c for c in planned if c not in used and c not in keep]
    return [c for c in keep if c in planned] + earlier
