"""How often two runs of one job over the same records gave the same answer.

The canary (``pipelines.canary``) and ``jobs tune`` run a sample under a setting and
under the reference (``jobs.reference``) and compare what each committed: the share of
the reference's answered records the other run answered the same.
"""

from __future__ import annotations

import math
from typing import Any

from nightshift.evaluation.read import committed_frames, output_target
from nightshift.intervals import wilson
from nightshift.io.outputs import JobOutput
from nightshift.jobs.spec import JobSpec


def answers(location: str) -> dict[Any, Any]:
    """A run's committed answers by record id (ok rows; a failed record has none)."""
    output = JobOutput(location)
    if output.plans.manifest() is None:
        return {}
    frames = committed_frames(output, output_target(output), truth=None)
    return dict(zip(frames.ok["id"].to_list(), frames.ok["answer"].to_list(), strict=True))


# Two embeddings of one text are the same answer at this cosine or above: no float
# setting (an FP8 KV cache, another batch) gives bit-equal vectors, and neighbours
# found by cosine do not move for differences this small.
SAME_VECTOR_COSINE = 0.99


def agreement(reference: dict[Any, Any], candidate: dict[Any, Any]) -> float | None:
    """The share of the reference's answered records the candidate answers the same
    (a record it failed or left out counts as different; embeddings are the same at a
    cosine of ``SAME_VECTOR_COSINE``); None when there are none."""
    if not reference:
        return None
    same = sum(_same(candidate.get(i), answer) for i, answer in reference.items())
    return round(same / len(reference), 4)


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, list | tuple) and isinstance(got, list | tuple):  # embeddings
        dot = sum(a * b for a, b in zip(got, want, strict=False))
        norms = math.sqrt(sum(a * a for a in got) * sum(b * b for b in want))
        return len(got) == len(want) and norms > 0 and dot / norms >= SAME_VECTOR_COSINE
    return got is not None and got == want


def agreement_figures(reference: dict[Any, Any], got: dict[Any, Any]) -> dict[str, Any]:
    """The share of the reference's answered records ``got`` answers the same, its 95%
    Wilson interval and the count it is over."""
    same = sum(_same(got.get(i), answer) for i, answer in reference.items())
    total = len(reference)
    return {
        "agreement": round(same / total, 4) if total else None,
        "agreement_ci": wilson(same, total),
        "agreement_of": total,
    }


def quality_figures(reference: dict[Any, bool] | None, got: dict[Any, bool] | None) -> dict:
    """Accuracy with its interval, and the flips against the reference: records the
    reference got right that this candidate gets wrong, and the other way round (a
    record the candidate failed counts as wrong). Empty without labels."""
    if got is None:
        return {}
    right = sum(got.values())
    found: dict[str, Any] = {
        "accuracy": round(right / len(got), 4) if got else None,
        "accuracy_ci": wilson(right, len(got)),
        "accuracy_of": len(got),
    }
    if reference is not None:
        found["flips"] = {
            "right_to_wrong": sum(r and not got.get(i, False) for i, r in reference.items()),
            "wrong_to_right": sum(not r and got.get(i, False) for i, r in reference.items()),
            "of": len(reference),
        }
    return found


def outputs_answers(outputs: list[str], spec: JobSpec) -> tuple[dict, dict | None]:
    """Every round's committed answers by record id, and whether each is right where the
    job has ``eval.label_column`` (None without labels)."""
    got: dict[Any, Any] = {}
    for out in outputs:
        got.update(answers(out))
    column = spec.eval.label_column if spec.eval is not None else None
    if column is None:
        return got, None
    right: dict[Any, bool] = {}
    for out in outputs:
        right.update(_right(out, column))
    return got, right


def _right(out: str, column: str) -> dict[Any, bool]:
    """Each committed record's answer against its label (a failed record is wrong; a
    record without a label is left out)."""
    output = JobOutput(out)
    frames = committed_frames(output, output_target(output), column)
    if not frames.has_truth:
        return {}
    found: dict[Any, bool] = {}
    for frame, answered in ((frames.ok, True), (frames.failed, False)):
        rows = frame.filter(frame["truth"].is_not_null())
        answers = rows["answer"].to_list() if answered else [None] * rows.height
        for i, truth, answer in zip(
            rows["id"].to_list(), rows["truth"].to_list(), answers, strict=True
        ):
            found[i] = answered and answer == truth
    return found
