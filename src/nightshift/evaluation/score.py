"""An output's quality from its committed rows: which records count, and how.

Pure over polars frames (``evaluation.read`` does the reading). The frames:

- ``ok``: ``id``, ``truth``, ``answer`` (the label, the JSON, or the text)
- ``failed``: ``id``, ``truth``, ``text`` (what the engine said, when it said anything)
- ``rejected``: ``id``, ``truth``

How records count (the same for the report and ``jobs eval``):

- A record whose true value is null (or, for extract, not JSON) is **unlabelled**: counted
  apart, in no denominator.
- ``accuracy`` (and every other metric) is over the **answered** labelled records: those
  with an ok row. A failed or rejected record gave no answer to score; it is not counted
  correct, and shows in ``coverage = answered / (answered + failed + rejected)``.
  ``accuracy_of_labelled = correct / (answered + failed + rejected)`` counts them wrong.
- extract: ``valid_json_rate`` is over every answer the engine gave (ok and failed rows),
  since an ok answer is valid JSON by construction.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import polars as pl

from nightshift.evaluation import metrics
from nightshift.intervals import wilson

RULES = (
    "accuracy and the other metrics are over answered labelled records (an ok row); failed "
    "and rejected labelled records are not correct and show in coverage = answered / "
    "(answered + failed + rejected); accuracy_of_labelled = correct / the same; records "
    "without a label are counted apart, in no denominator"
)


def _labelled(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("truth").is_not_null())


def _references(frame: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """extract: the rows whose reference parses, their references parsed (``ref``), and
    how many did not parse."""
    refs = [metrics.parse_json(v) for v in frame["truth"].to_list()]
    good = pl.Series([ok for ok, _ in refs], dtype=pl.Boolean)
    kept = frame.filter(good)
    parsed = [value for ok, value in refs if ok]
    return kept.with_columns(pl.Series("ref", parsed, dtype=pl.Object)), len(refs) - len(parsed)


def score(
    kind: str,
    labels: list[str],
    ok: pl.DataFrame,
    failed: pl.DataFrame,
    rejected: pl.DataFrame,
) -> dict[str, Any]:
    """The ``quality`` section: record counts, coverage and the task's metrics."""
    unlabelled = sum(f["truth"].null_count() for f in (ok, failed, rejected))
    ok, failed, rejected = _labelled(ok), _labelled(failed), _labelled(rejected)
    bad = 0
    if kind == "extract":
        (ok, bad_ok), (failed, bad_failed) = _references(ok), _references(failed)
        rejected, bad_rejected = _references(rejected)
        bad = bad_ok + bad_failed + bad_rejected
        figures = _extract(ok, failed)
    elif kind == "classify":
        figures = metrics.classification_of_pairs(_pair_counts(ok, "truth", "answer"), labels)
    else:
        figures = metrics.generation(_text(ok["answer"]), _text(ok["truth"]))
    labelled = ok.height + failed.height + rejected.height
    records = {
        "labelled": labelled,
        "answered": ok.height,
        "failed": failed.height,
        "rejected": rejected.height,
        "unlabelled": unlabelled + bad,
    }
    if kind == "extract":
        records["reference_not_json"] = bad  # among unlabelled
    return {
        "kind": kind,
        "records": records,
        "coverage": ok.height / labelled if labelled else None,
        "coverage_ci": wilson(ok.height, labelled),
        "accuracy_of_labelled": figures["correct"] / labelled if labelled else None,
        "accuracy_of_labelled_ci": wilson(figures["correct"], labelled),
        **with_intervals(figures),
        "rules": RULES,
    }


def with_intervals(figures: dict[str, Any]) -> dict[str, Any]:
    """``figures`` with a 95% Wilson interval (``<name>_ci``, two numbers) beside every
    share that is a count over a count: accuracy, exact match, each label's precision
    and recall, each field's exact match. chrF and F1 are not shares of records and get
    none. A share over no records has the interval None."""
    out = dict(figures)
    correct, scored = figures["correct"], figures["scored"]
    for name in ("accuracy", "exact_match_rate"):
        if name in figures:
            out[f"{name}_ci"] = wilson(correct, scored)
    if "per_label" in figures:
        out["per_label"] = {
            label: {
                **m,
                "precision_ci": wilson(round(m["precision"] * m["predicted"]), m["predicted"]),
                "recall_ci": wilson(round(m["recall"] * m["support"]), m["support"]),
            }
            for label, m in figures["per_label"].items()
        }
    if "per_field" in figures:
        out["per_field"] = {
            name: {**f, "exact_match_rate_ci": wilson(f["matches"], f["records"])}
            for name, f in figures["per_field"].items()
        }
    return out


def _text(column: pl.Series) -> list[str]:
    """Values as text: a label column of integers scores against labels written as text."""
    return [_as_text(v) for v in column.to_list()]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _pair_counts(frame: pl.DataFrame, first: str, second: str) -> Counter:
    """How many rows hold each pair of values of ``first`` and ``second``, as text:
    counted by polars, so a million answers never become two million Python strings
    (0.13 GiB of a report's peak at a million records)."""
    pairs: Counter = Counter()
    for a, b, rows in frame.group_by(first, second).len().iter_rows():
        pairs[(_as_text(a), _as_text(b))] += rows
    return pairs


def _extract(ok: pl.DataFrame, failed: pl.DataFrame) -> dict[str, Any]:
    figures = metrics.extraction(ok["answer"].to_list(), ok["ref"].to_list())
    given = ok["answer"].to_list() + failed["text"].to_list()
    valid = sum(t is not None and metrics.parse_json(t)[0] for t in given)
    figures["valid_json_rate"] = valid / len(given) if given else None
    figures["valid_json_note"] = "over every answer given: ok and failed rows"
    return figures


def with_cost(quality: dict[str, Any], usd_total: float | None) -> dict[str, Any]:
    """``quality`` with the cost of 1,000 correct answers (``cost.usd_total`` of the
    report, that is of the run that wrote it, over every correct answer in the output)."""
    correct = quality.get("correct")
    per_1000 = usd_total / correct * 1000 if usd_total is not None and correct else None
    return {
        **quality,
        "usd_per_1000_correct": per_1000,
        "usd_per_1000_correct_basis": "cost.usd_total / correct x 1000",
    }
