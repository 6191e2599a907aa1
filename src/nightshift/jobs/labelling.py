"""Scored labels a chunk at a time: the label and confidence of every scored classify
answer in a checkpoint's rows, computed in NumPy at once.

Labelling one answer at a time in Python (``label_of``, which ``ClassifyHandler.parse``
uses) cost 6 µs a record, the largest part of nightshift's own work per classify record
while generating (``benchmarks/run_path.py``). An answer is still checked when it comes
back (scores for every label, not all of them impossible: else it is a failed row at
once), but its label and confidence are left open in its row (``scored_columns``) until
its chunk's table is built (``label_rows``), where a chunk of rows costs about what one
row did.

The chunk's arithmetic is the record's, step by step, in the same order: the leaning
subtracted, each weight ``exp(score - top)``, the weights summed left to right, each
divided by the sum, the first likeliest label, its chance rounded by Python's ``round``.
A row with a score that is NaN or +inf (no engine should give one) goes through
``label_of`` itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from nightshift.errors import RecordError

# The row key under which a scored answer waits for its chunk: (its scoring, its
# scores). Not an output column, so a table never writes it.
SCORED = "__scored"


@dataclass(frozen=True)
class LabelScoring:
    """Classify by score: ``tokens`` are the labels' first token ids (distinct), in label
    order; ``log_prior`` the model's leaning, the mean probability it gives each label
    over a sample of the job's records (None until measured: no correction)."""

    labels: tuple[str, ...]
    tokens: tuple[int, ...]
    log_prior: tuple[float, ...] | None = None

    @cached_property
    def plain_prior(self) -> bool:
        """Whether the leaning is one a calibration writes: a number a label, each well
        inside a float's range (a log of a ratio of probabilities floored at 1e-9). Only
        then is an answer's check a look at its scores alone (``answer_columns``): a
        stored file edited to hold an infinity, a huge number (its subtraction overflows)
        or too few numbers is met answer by answer, as before."""
        prior = self.log_prior
        if prior is None:
            return True
        return len(prior) == len(self.labels) and all(abs(p) < 1e6 for p in prior)

    def probabilities(self, scores: Sequence[float]) -> list[float]:
        """Each label's probability given its first token's log probability, the
        leaning divided out (``log_prior``) and the labels' total made 1."""
        prior = self.log_prior or (0.0,) * len(scores)
        adjusted = [s - p for s, p in zip(scores, prior, strict=True)]
        top = max(adjusted)
        if top == -math.inf:
            raise RecordError("the engine gave every label a probability of 0")
        weights = [math.exp(a - top) for a in adjusted]
        total = 0.0  # left to right, as label_rows sums (sum() compensates from 3.12)
        for w in weights:
            total += w
        return [w / total for w in weights]


def label_of(scoring: LabelScoring, scores: Sequence[float]) -> tuple[str, float]:
    """One answer's label and confidence (the likeliest label's chance, rounded)."""
    chances = scoring.probabilities(scores)
    best = max(range(len(chances)), key=chances.__getitem__)
    return scoring.labels[best], round(chances[best], 6)


def scored_columns(scoring: LabelScoring, scores: Sequence[float]) -> dict[str, Any]:
    """A checked scored answer's columns, its label and confidence left to its chunk's
    ``label_rows``. One scoring step ends at max_tokens 1, yet the label is whole: the
    answer was not cut off."""
    return {
        "label": None,
        "text": None,
        "confidence": None,
        "finish_reason": "stop",
        SCORED: (scoring, scores),
    }


def label_rows(rows: list[dict[str, Any]]) -> None:
    """Fill in the label, text and confidence that ``scored_columns`` left open in
    ``rows`` (a row of another adapter carries its own scoring). A row keeps what it
    waits on until it is labelled: a failure here leaves none half done."""
    groups: dict[int, tuple[LabelScoring, list[dict], list[Sequence[float]]]] = {}
    for row in rows:
        if SCORED in row:
            scoring, scores = row[SCORED]
            group = groups.setdefault(id(scoring), (scoring, [], []))
            group[1].append(row)
            group[2].append(scores)
    for scoring, group_rows, scores in groups.values():
        _label(scoring, group_rows, scores)


def _label(scoring: LabelScoring, rows: list[dict], scores: list[Sequence[float]]) -> None:
    s = np.array(scores, dtype=np.float64)
    prior = np.array(scoring.log_prior or (0.0,) * s.shape[1], dtype=np.float64)
    with np.errstate(invalid="ignore"):  # a NaN or +inf score: labelled by hand below
        adjusted = s - prior
        top = adjusted.max(axis=1)
        # the C library's exp, as math.exp: NumPy's own (AVX-512) may differ in a last bit
        shifted = (adjusted - top[:, None]).ravel().tolist()
        weights = np.fromiter(map(math.exp, shifted), np.float64, len(shifted))
        weights = weights.reshape(adjusted.shape)
        total = weights[:, 0].copy()  # summed left to right, as probabilities() does
        for column in range(1, weights.shape[1]):
            total += weights[:, column]
        chances = weights / total[:, None]
    best = chances.argmax(axis=1)  # the first of equals, as max() over the labels
    chance = chances[np.arange(len(rows)), best].tolist()
    labels = [scoring.labels[b] for b in best.tolist()]
    confidence = [round(c, 6) for c in chance]
    # NumPy's max meets a NaN otherwise than Python's: the same label, another NaN
    for i in np.flatnonzero((np.isnan(s) | (s == math.inf)).any(axis=1)).tolist():
        labels[i], confidence[i] = label_of(scoring, scores[i])
    for row, label, c in zip(rows, labels, confidence, strict=True):
        row["label"] = row["text"] = label
        row["confidence"] = c
        del row[SCORED]
