"""How often two runs of one job over the same records gave the same answer.

The canary (``pipelines.canary``) and ``jobs tune`` run a sample under a setting and
under the reference (``jobs.reference``) and compare what each committed: the share of
the reference's answered records the other run answered the same.
"""

from __future__ import annotations

import math
from typing import Any

from nightshift.evaluation.read import committed_frames, output_target
from nightshift.io.outputs import JobOutput


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
