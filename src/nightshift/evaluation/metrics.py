"""Quality metrics as plain functions over lists: no I/O, no engine, no polars.

Every function takes the answered records only (answers beside their true values);
which records those are, and what happens to the rest (failed, rejected, unlabelled),
is ``evaluation.score``'s business.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def _ratio(part: float, whole: float) -> float | None:
    """part / whole, or None when there is nothing to divide (no records scored)."""
    return part / whole if whole else None


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def classification(truth: list[str], predicted: list[str], labels: list[str]) -> dict[str, Any]:
    """Accuracy, macro F1, per-label precision/recall/F1/support and the confusion matrix
    (rows: true label, columns: predicted). ``labels`` (the task's) come first on both
    axes, then any other value met in ``truth`` or ``predicted``, sorted. Macro F1
    averages the labels that occur in ``truth`` or ``predicted`` (as scikit-learn does by
    default); precision of a label never predicted is 0."""
    if len(truth) != len(predicted):
        raise ValueError("truth and predicted differ in length")
    return classification_of_pairs(Counter(zip(truth, predicted, strict=True)), labels)


def classification_of_pairs(pairs: Counter, labels: list[str]) -> dict[str, Any]:
    """``classification`` from how many records have each (true, predicted) pair: what a
    million answers come to, counted where they are (``evaluation.score``)."""
    seen = {value for pair, n in pairs.items() if n for value in pair}
    axis = list(labels) + sorted(seen - set(labels))
    matrix = [[pairs[(t, p)] for p in axis] for t in axis]
    per_label = {}
    for i, label in enumerate(axis):
        hits = matrix[i][i]
        support = sum(matrix[i])
        chosen = sum(row[i] for row in matrix)
        precision = hits / chosen if chosen else 0.0
        recall = hits / support if support else 0.0
        per_label[label] = {
            "precision": precision,
            "recall": recall,
            "f1": _f1(precision, recall),
            "support": support,
            "predicted": chosen,
        }
    scored = [v["f1"] for k, v in per_label.items() if k in seen]
    correct = sum(matrix[i][i] for i in range(len(axis)))
    records = sum(pairs.values())
    return {
        "scored": records,
        "correct": correct,
        "accuracy": _ratio(correct, records),
        "macro_f1": _ratio(sum(scored), len(scored)),
        "per_label": per_label,
        "confusion": {"labels": axis, "matrix": matrix},
    }


def parse_json(value: Any) -> tuple[bool, Any]:
    """(parsed, value): text is parsed as JSON, anything else (a struct read as a dict, a
    number) is taken as it is, less its null fields; text that is not JSON gives
    (False, None)."""
    if not isinstance(value, str):
        return True, _present(value)
    try:
        return True, json.loads(value)
    except json.JSONDecodeError:
        return False, None


def _present(value: Any) -> Any:
    """A Parquet struct without its null fields, at any depth: every row of a struct
    column has every field, so a field a reference leaves out reads back as null. It is
    absent, not a null value (JSON text can say either; a struct cannot)."""
    if isinstance(value, dict):
        return {k: _present(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_present(v) for v in value]
    return value


def extraction(answers: list[str], references: list[Any]) -> dict[str, Any]:
    """Valid-JSON rate of ``answers``, whole-answer exact match, and per-field exact match
    against each reference (a JSON object): for every top-level field of any reference,
    the share of the records whose reference has it that give the same value (an answer
    that is not JSON, or lacks the field, does not match)."""
    if len(answers) != len(references):
        raise ValueError("answers and references differ in length")
    parsed = [parse_json(a) for a in answers]
    valid = sum(ok for ok, _ in parsed)
    exact = sum(ok and value == ref for (ok, value), ref in zip(parsed, references, strict=True))
    fields: dict[str, list[int]] = {}  # field -> [matches, records with it]
    for (ok, value), ref in zip(parsed, references, strict=True):
        if not isinstance(ref, dict):
            continue
        for name, expected in ref.items():
            counts = fields.setdefault(name, [0, 0])
            counts[1] += 1
            if ok and isinstance(value, dict) and name in value and value[name] == expected:
                counts[0] += 1
    return {
        "scored": len(answers),
        "correct": exact,
        "valid_json_rate": _ratio(valid, len(answers)),
        "exact_match_rate": _ratio(exact, len(answers)),
        "per_field": {
            name: {"exact_match_rate": m / n, "records": n, "matches": m}
            for name, (m, n) in sorted(fields.items())
        },
    }


def generation(answers: list[str], references: list[str]) -> dict[str, Any]:
    """Exact-match rate (after trimming surrounding whitespace) and corpus chrF (sacrebleu's
    ``corpus_chrf``, character 6-grams, beta 2; 0 to 100)."""
    if len(answers) != len(references):
        raise ValueError("answers and references differ in length")
    exact = sum(a.strip() == r.strip() for a, r in zip(answers, references, strict=True))
    chrf = None
    if answers:
        from sacrebleu.metrics import CHRF

        chrf = CHRF().corpus_score(answers, [references]).score
    return {
        "scored": len(answers),
        "correct": exact,
        "exact_match_rate": _ratio(exact, len(answers)),
        "chrf": chrf,
        "chrf_note": "sacrebleu corpus chrF (character 6-grams, beta 2), 0 to 100",
    }
