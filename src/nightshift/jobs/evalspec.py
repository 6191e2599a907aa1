"""The spec's ``eval:`` section: which input column holds each record's true answer.

The column travels with its record into the results (kept like ``input.keep_columns``,
see ``jobs.kept``) so the report can score the committed answers, but it never reaches
the prompt: a label in the prompt is a leak, refused here by name. Eval settings do not
change answers, so they are not part of the fingerprint (``jobs.fingerprint``): a
resumed run may add or drop them. (``jobs.kept`` says which columns results carry.)
"""

from __future__ import annotations

from typing import Protocol

from pydantic import Field, model_validator

from nightshift.jobs.columns import DETAIL_COLUMNS, OUTPUT_COLUMNS
from nightshift.jobs.section import Section

# Which key a task kind is scored by.
EVAL_KEY = {
    "classify": "label_column",
    "extract": "reference_column",
    "generate": "reference_column",
}


class EvalKeyError(ValueError):
    """A problem with one key of ``eval``; ``subkey`` names it for the spec loader."""

    def __init__(self, subkey: str, message: str) -> None:
        super().__init__(message)
        self.subkey = subkey


class EvalSpec(Section):
    label_column: str | None = Field(
        default=None,
        description="classify: input column holding each record's true label. The report "
        "then gives accuracy, macro F1, per-label precision/recall/F1 and the confusion "
        "matrix over the committed answers. Kept in the results, never in the prompt; a "
        "record whose label is null is counted apart.",
    )
    reference_column: str | None = Field(
        default=None,
        description="extract: input column holding each record's reference JSON (an "
        "object, as text or a struct): valid-JSON rate and per-field exact match. "
        "generate: the reference text: exact-match rate and chrF (sacrebleu). Kept in the "
        "results, never in the prompt.",
    )

    @model_validator(mode="after")
    def _one_column(self) -> EvalSpec:
        if (self.label_column is None) == (self.reference_column is None):
            raise ValueError(
                "give one of eval.label_column (classify) or eval.reference_column "
                "(extract, generate)"
            )
        for name in ("label_column", "reference_column"):
            column = getattr(self, name)
            if column is not None and not column.strip():
                raise EvalKeyError(name, "is empty; name the input column")
        return self

    @property
    def key(self) -> str:
        """The spec key set: ``eval.label_column`` or ``eval.reference_column``."""
        return "eval.label_column" if self.label_column is not None else "eval.reference_column"

    @property
    def column(self) -> str:
        return self.label_column if self.label_column is not None else self.reference_column


class _Prompt(Protocol):  # jobs.spec.PromptSpec, which imports this module
    def columns(self) -> list[str]: ...
    def source_key(self) -> str: ...


class _Input(Protocol):  # jobs.inputspec.InputSpec
    id_column: str
    sampling_column: str | None


def check_eval(ev: EvalSpec | None, kind: str, prompt: _Prompt, inputs: _Input) -> None:
    """The eval column suits the task (``kind``) and stays out of the prompt and of
    nightshift's own columns."""
    if ev is None:
        return
    key, column = ev.key, ev.column  # at the spec's top level: the full dotted key
    if kind not in EVAL_KEY:
        raise EvalKeyError(key, f"task.kind {kind} has no answers to score; remove eval")
    wanted = EVAL_KEY[kind]
    if key != f"eval.{wanted}":
        raise EvalKeyError(key, f"does not score task.kind {kind}; use eval.{wanted} instead")
    if column in prompt.columns():
        raise EvalKeyError(
            key,
            f"column {column!r} is in {prompt.source_key()}: the true answer would be in "
            "the prompt (a leak); take it out of the prompt",
        )
    problem = _clash(column, inputs.id_column, inputs.sampling_column)
    if problem:
        raise EvalKeyError(key, problem)


def _clash(column: str, id_column: str, sampling_column: str | None) -> str | None:
    if column == id_column:
        return f"column {column!r} is input.id_column; name the column of true answers"
    if column == sampling_column:
        return f"column {column!r} is input.sampling_column; name the column of true answers"
    written = OUTPUT_COLUMNS | (DETAIL_COLUMNS if sampling_column else frozenset())
    if column in written:
        return (
            f"column {column!r} would clash with the output column of that name (the "
            "answer); rename it in the input, for example to true_" + column
        )
    return None
