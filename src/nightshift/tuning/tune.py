"""``jobs tune``: every candidate setting run on the same rounds of records, the
reference first.

The reference's answers are what every other candidate is compared with; the choice
(``tuning.verdict``) keeps the job's setting unless a measurable candidate whose
agreement interval clears ``min_agreement`` beats it beyond the rounds' spread. What
was measured is written after each candidate (tune.json, tune.md, tune.png), so a
Ctrl-C leaves every finished candidate's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightshift.jobs.loading import apply_override, read_yaml, validate_spec
from nightshift.jobs.spec import JobSpec
from nightshift.running.canary import comparable_ids
from nightshift.tuning.binding import local_gpu
from nightshift.tuning.candidates import (
    JOB,
    Candidate,
    default_candidates,
    effective,
    parse_tries,
    reference,
)
from nightshift.tuning.files import candidate_folders, write_tune_files
from nightshift.tuning.grid import grid_candidates
from nightshift.tuning.rounds import measure_candidate
from nightshift.tuning.sizing import (
    ROUNDS,
    job_order,
    limits_of,
    round_ids,
    sample_cost,
    sample_summary,
    size_rounds,
    write_rounds,
)
from nightshift.tuning.verdict import choose, job_entry


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


def candidates_for(
    job: TuneJob, tries: list[str], defaults: bool = True, grid: bool = False
) -> list[Candidate]:
    """The reference first, then the defaults and ``--try``'s (``grid``: every
    combination of their values), each distinct setting once (a candidate that is the
    reference, once applied, is left out)."""
    found, seen = [], set()
    levers = default_candidates(job.spec) if defaults else []
    tried = grid_candidates(tries) if grid else parse_tries(tries)
    for c in [reference(job.spec), Candidate(JOB), *levers, *tried]:
        key = repr(effective(job.data, c))
        if key not in seen:
            seen.add(key)
            found.append(c)
    return found


def run_tune(
    job: TuneJob, candidates: list[Candidate], size: int | None, bar=None, rounds: int = ROUNDS
) -> dict:
    """Measure every candidate in ``rounds`` rounds of ``size`` records (default: what
    the largest batch limits tried need, ``tuning.sizing``); the summary tune.json holds
    (written after each candidate)."""
    order = job_order(job.spec)
    limits = [limits_of(validate_spec(c.applied(job.data))) for c in candidates]
    sizing = size_rounds(order.height, int(order["tokens"].sum()), limits, rounds, size)
    ids = round_ids(order, sizing)
    samples = write_rounds(job.spec, ids, job.folder / "sample")
    compared, why = comparable_ids(job.spec, list(dict.fromkeys(i for r in ids for i in r)))
    summary = {
        "job": job.spec.name,
        "sample": {**sample_summary(sizing), "compared": len(compared)},
        "min_agreement": job.min_agreement,
        "price": {"usd_per_gpu_hour": job.spec.cost.usd_per_gpu_hour, "gpus": job.spec.cost.gpus},
        "candidates": [],
    }
    if why:  # sampled answers: agreement would compare two random draws
        summary["sample"]["nothing_to_compare"] = why
    base: dict = {"compared": set(compared), "why": why}
    for candidate, name in zip(candidates, candidate_folders(candidates), strict=True):
        folder = job.folder / "runs" / name
        entry = measure_candidate(job, candidate, samples, sizing, base, folder)
        summary["candidates"].append(entry)
        summary["chosen"] = choose(summary["candidates"], job.min_agreement)
        job_figures = job_entry(summary["candidates"])
        summary["sample"]["cost"] = sample_cost(summary["candidates"], job_figures, order.height)
        write_tune_files(job.folder, summary)
        if bar is not None:
            bar.update(1)
    return summary
