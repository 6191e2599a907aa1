"""``jobs tune``: every candidate setting run on the same sample, the reference first.

The reference's answers are what every other candidate is compared with; the choice is
the fastest candidate whose agreement stays at or above ``min_agreement``. What was
measured is written after each candidate (tune.json, tune.md, tune.png), so a Ctrl-C
leaves every finished candidate's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightshift.evaluation.agreement import agreement, answers
from nightshift.jobs.loading import apply_override, read_yaml, validate_spec
from nightshift.jobs.spec import JobSpec
from nightshift.tuning.binding import local_gpu, measured_limit, predicted_limit
from nightshift.tuning.candidates import (
    JOB,
    REFERENCE,
    Candidate,
    default_candidates,
    parse_tries,
    reference,
)
from nightshift.tuning.files import write_tune_files
from nightshift.tuning.measure import figures, run_candidate
from nightshift.tuning.sample import sample_ids, write_sample


@dataclass
class TuneJob:
    """What a tune works from: the spec as the user runs it, and where it writes."""

    data: dict[str, Any]  # the spec file with the user's --set applied
    spec: JobSpec
    folder: Path
    min_agreement: float = 0.98
    gpu: str | None = None  # the GPU the capacity planner predicts for (None: no prediction)

    @classmethod
    def load(
        cls,
        path: Path,
        overrides: list[str],
        folder: Path | None,
        min_agreement: float,
        gpu: str | None = None,
    ):
        data = read_yaml(path)
        for item in overrides or []:
            apply_override(data, item)
        spec = validate_spec(data)
        gpu = gpu or local_gpu()
        return cls(data, spec, folder or default_folder(spec), min_agreement, gpu)


def default_folder(spec: JobSpec) -> Path:
    """Beside a local output (OUTPUT.tune), or under .nightshift/tune for S3."""
    if "://" in spec.output.path:
        return Path(".nightshift") / "tune" / spec.name
    return Path(f"{spec.output.path.rstrip('/')}.tune")


def candidates_for(job: TuneJob, tries: list[str], defaults: bool = True) -> list[Candidate]:
    """The reference first, then the defaults and ``--try``'s, each distinct setting
    once (a candidate that is the reference, once applied, is left out)."""
    found, seen = [], set()
    levers = default_candidates(job.spec) if defaults else []
    for c in [reference(job.spec), Candidate(JOB), *levers, *parse_tries(tries)]:
        key = repr(_effective(job.data, c))
        if key not in seen:
            seen.add(key)
            found.append(c)
    return found


def job_is_reference(job: TuneJob) -> bool:
    """Whether the job as it is already runs at the reference's settings."""
    return _effective(job.data, reference(job.spec)) == _effective(job.data, Candidate(JOB))


def _effective(data: dict[str, Any], candidate: Candidate) -> dict[str, Any]:
    """The whole spec ``candidate`` runs, defaults filled in (an engine.extra key set
    to None is vLLM's default, the same engine as without it)."""
    dumped = validate_spec(candidate.applied(data)).model_dump(mode="json")
    extra = dumped["engine"]["extra"]
    dumped["engine"]["extra"] = {k: v for k, v in extra.items() if v is not None}
    return dumped


def run_tune(job: TuneJob, candidates: list[Candidate], size: int | None, bar=None) -> dict:
    """Measure every candidate; the summary tune.json holds (written after each one)."""
    ids, total = sample_ids(job.spec, size)
    sample = write_sample(job.spec, ids, job.folder / "sample.parquet")
    summary = {
        "job": job.spec.name,
        "sample": {
            "records": len(ids),
            "job_records": total,
            "share": round(len(ids) / max(total, 1), 4),
        },
        "min_agreement": job.min_agreement,
        "price": {"usd_per_gpu_hour": job.spec.cost.usd_per_gpu_hour, "gpus": job.spec.cost.gpus},
        "candidates": [],
    }
    base: dict = {}
    for candidate in candidates:
        entry = _measure(job, candidate, sample, base)
        summary["candidates"].append(entry)
        summary["chosen"] = choose(summary["candidates"], job.min_agreement)
        write_tune_files(job.folder, summary)
        if bar is not None:
            bar.update(1)
    return summary


def _measure(job: TuneJob, candidate: Candidate, sample: Path, base: dict) -> dict[str, Any]:
    out = job.folder / "runs" / _slug(candidate.name)
    ran = run_candidate(job.data, candidate, sample, out)
    entry: dict[str, Any] = {"name": candidate.name, "sets": candidate.sets, "output": str(out)}
    if "error" in ran:
        return {**entry, "error": ran["error"]}
    cost = job.spec.cost
    entry.update(figures(ran["report"], cost.usd_per_gpu_hour, cost.gpus))
    measured = measured_limit(ran["report"], ran["spec"])
    predicted = predicted_limit(ran["spec"], str(out), ran["report"], job.gpu)
    entry["bound_by"] = measured["bound_by"]
    entry["limit"] = {"measured": measured, "predicted": predicted}
    got = answers(str(out))
    if candidate.name == REFERENCE:
        base["answers"] = got
        entry["is_job"] = job_is_reference(job)
    entry["agreement"] = agreement(base.get("answers", {}), got)
    return entry


def choose(entries: list[dict[str, Any]], min_agreement: float) -> dict[str, Any] | None:
    """The fastest candidate whose answers agree with the reference's at least
    ``min_agreement`` of the time, and how it compares with the job as it is."""
    fit = [e for e in entries if "error" not in e and (e.get("agreement") or 0) >= min_agreement]
    if not fit:
        return None
    best = max(fit, key=lambda e: e["tokens_per_s"])
    # a job already at the reference's settings was run once, as the reference
    ok = [e for e in entries if "error" not in e]
    job = next((e for e in ok if e["name"] == JOB), None)
    job = job or next((e for e in ok if e["name"] == REFERENCE and e.get("is_job")), None)
    speedup = best["tokens_per_s"] / job["tokens_per_s"] if job and job["tokens_per_s"] else None
    return {
        "name": best["name"],
        "sets": best["sets"],
        "speedup_over_job": speedup and round(speedup, 3),
    }


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:60]
