"""What ``jobs tune`` concludes: agreement and accuracy with their 95% intervals, the
records a candidate turns right to wrong and wrong to right, and the choice.

The choice keeps the job's own setting unless a candidate beats it beyond noise: a
candidate wins only when its slowest round is faster than the job's fastest (the
spread of each is what a difference must clear), when its sample could show its batch
limits (``tuning.sizing.not_measurable``), and when its agreement interval with the
reference lies at or above ``min_agreement`` (invariant 14: a decision rests on the
interval, not the point). The gain stated is the median rounds' ratio. Where the job's
own answers are shown to differ (its interval lies under the bar), the fastest
candidate that clears the bar is chosen for quality, whatever its speed.
"""

from __future__ import annotations

from typing import Any

from nightshift.tuning.candidates import JOB, REFERENCE

NO_WINNER = "no candidate beats the job's setting beyond noise"


def job_entry(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The job as it is (run once as the reference where it is the reference)."""
    ok = [e for e in entries if "error" not in e]
    found = next((e for e in ok if e["name"] == JOB), None)
    return found or next((e for e in ok if e["name"] == REFERENCE and e.get("is_job")), None)


def clears(entry: dict[str, Any], min_agreement: float) -> bool:
    """Its agreement interval lies at or above the bar (the reference agrees by definition)."""
    if entry["name"] == REFERENCE:
        return True
    ci = entry.get("agreement_ci")
    if ci is None and entry.get("nothing_to_compare"):  # sampled: two draws never agree
        return bool(entry.get("same_answers"))  # only a setting that changes no answer
    return ci is not None and ci[0] >= min_agreement


def below(entry: dict[str, Any], min_agreement: float) -> bool:
    """Its agreement interval lies wholly under the bar: its answers are shown to differ."""
    ci = entry.get("agreement_ci")
    return entry["name"] != REFERENCE and ci is not None and ci[1] < min_agreement


def beats(entry: dict[str, Any], job: dict[str, Any]) -> bool:
    """Faster than the job beyond the spread: its slowest round beats the job's fastest."""
    mine = entry.get("rounds_tokens_per_s") or [entry["tokens_per_s"]]
    theirs = job.get("rounds_tokens_per_s") or [job["tokens_per_s"]]
    return min(mine) > max(theirs)


def choose(entries: list[dict[str, Any]], min_agreement: float) -> dict[str, Any] | None:
    """The setting to run the job with, why, and its predicted gain over the job's
    tokens/s; None when the job itself did not run (nothing to compare with)."""
    job = job_entry(entries)
    if job is None:
        return None
    fit = [
        e
        for e in entries
        if "error" not in e and not e.get("not_measurable") and clears(e, min_agreement)
    ]
    fit.sort(key=lambda e: e["tokens_per_s"], reverse=True)
    if job.get("not_measurable"):
        return _pick(job, job, f"the job's own setting is {job['not_measurable']}")
    if below(job, min_agreement):
        if not fit:
            return None
        return _pick(fit[0], job, "the job's answers differ from the reference's beyond the bar")
    winners = [e for e in fit if e is not job and beats(e, job)]
    if not winners:
        return _pick(job, job, NO_WINNER)
    return _pick(winners[0], job, "beats the job's setting beyond the rounds' spread")


def _pick(entry: dict[str, Any], job: dict[str, Any], why: str) -> dict[str, Any]:
    gain = entry["tokens_per_s"] / job["tokens_per_s"] if job["tokens_per_s"] else None
    return {
        "name": entry["name"],
        "sets": entry["sets"],
        "speedup_over_job": gain and round(gain, 3),
        "why": why,
        "is_job": entry is job,
    }
