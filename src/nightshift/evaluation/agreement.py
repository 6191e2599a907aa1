"""How often two runs of one job over the same records gave the same answer.

The canary (``pipelines.canary``) and ``jobs tune`` run a sample under a setting and
under the reference (``jobs.reference``) and compare what each committed: the share of
the reference's answered records the other run answered the same.
"""

from __future__ import annotations

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


def agreement(reference: dict[Any, Any], candidate: dict[Any, Any]) -> float | None:
    """The share of the reference's answered records the candidate answers the same
    (a record it failed or left out counts as different); None when there are none."""
    if not reference:
        return None
    same = sum(candidate.get(i, object()) == answer for i, answer in reference.items())
    return round(same / len(reference), 4)
