"""One candidate of ``jobs tune`` measured in rounds: one engine, several passes.

A candidate's engine starts once and runs each round (a sample of other records, see
``tuning.sizing``) as a job of its own through ``jobs run``'s steps
(``pipelines.direct.run_job`` with that engine), so start-up is paid once and every
round is timed apart: the rounds' spread is what a difference between candidates has
to beat. Where the job is too small for rounds on other records, each round runs the
same records on a fresh engine instead (a warm engine would answer them from its
prefix cache). Every round runs with the canary off (a tune is the comparison) and the
response cache off (a cached answer would time nothing).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from nightshift.evaluation.agreement import agreement_figures, outputs_answers, quality_figures
from nightshift.jobs.spec import JobSpec
from nightshift.tuning.binding import measured_limit
from nightshift.tuning.candidates import REFERENCE, Candidate, job_is_reference
from nightshift.tuning.measure import candidate_spec, figures
from nightshift.tuning.sizing import Sizing, not_measurable


def round_spec(data: dict[str, Any], candidate: Candidate, sample: Path, out: Path) -> JobSpec:
    """``candidate``'s spec over ``sample`` into ``out``, the canary off."""
    data = {**data, "run": {**(data.get("run") or {}), "canary": False}}
    return candidate_spec(data, candidate, sample, out)


def run_rounds(
    data: dict[str, Any], candidate: Candidate, samples: list[Path], folder: Path, fresh: bool
) -> dict[str, Any]:
    """Each round's report and output folder, or the error the candidate met (an engine
    that refuses a setting is said, not fatal). ``fresh``: an engine per round."""
    from nightshift.console import engine_output_to
    from nightshift.errors import NightshiftError

    outs = [folder / f"round-{r + 1}" for r in range(len(samples))]
    try:
        specs = [round_spec(data, candidate, s, o) for s, o in zip(samples, outs, strict=True)]
        with engine_output_to(folder.with_suffix(".log")):
            reports, startup_s = _run_all(specs, fresh)
    except (NightshiftError, RuntimeError, ValueError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    found = {"reports": reports, "outputs": [str(o) for o in outs], "spec": specs[0]}
    return {**found, "startup_s": startup_s}


def _run_all(specs: list[JobSpec], fresh: bool) -> tuple[list[dict[str, Any]], float]:
    """The rounds' reports, and the start-up seconds of the engine they shared (0: each
    round started its own, and its report counts it)."""
    import time

    from nightshift.pipelines.direct import run_job
    from nightshift.running.engines import build_engine

    began = time.perf_counter()
    engine = None if fresh else build_engine(specs[0])
    startup_s = time.perf_counter() - began if engine is not None else 0.0
    try:
        reports = [
            run_job(spec, overwrite=True, progress=False, engine=engine).report for spec in specs
        ]
        return reports, startup_s
    finally:
        if engine is not None:
            engine.close()


def steady(report: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    """A round's speed from its first answer to its last: the wait before the first
    answer (label calibration, a cold engine's first steps) is paid once in a full job
    but in every round, and on a small round it would outweigh the batch limits tried."""
    answering = report["time_s"].get("generate_answering") or 0.0
    if answering <= 0:
        return found
    tokens = report["tokens"]
    speeds = {
        "tokens_per_s": round((tokens["prompt"] + tokens["output"]) / answering, 2),
        "records_per_s": round(found["records_answered"] / answering, 3),
    }
    return {**found, **speeds}


def _wait(report: dict[str, Any]) -> float:
    return report["time_s"].get("generate_before_first_answer") or 0.0


def round_figures(ran: dict[str, Any], usd_per_gpu_hour: float, gpus: int) -> dict[str, Any]:
    """Speed and cost over the rounds: the median round's speed (``steady``), each
    round's tokens/s and their spread ((slowest to fastest) over the median), the
    generation seconds and records of all rounds together (what the sample cost); the
    binding limit as the engine measured it."""
    each = [steady(r, figures(r, usd_per_gpu_hour, gpus)) for r in ran["reports"]]
    speeds = [f["tokens_per_s"] for f in each]
    middle = statistics.median(speeds)
    usd_per_s = usd_per_gpu_hour * gpus / 3600
    records_per_s = statistics.median(f["records_per_s"] for f in each)
    found = {
        **each[-1],
        "tokens_per_s": round(middle, 2),
        "records_per_s": round(records_per_s, 3),
        "usd_per_million_tokens": round(usd_per_s / middle * 1e6, 4) if middle else None,
        "usd_per_1000_records": round(usd_per_s / records_per_s * 1e3, 4)
        if records_per_s
        else None,
        "rounds_tokens_per_s": speeds,
        # the wait before each round's first answer: paid once by a full job
        "rounds_wait_s": [round(_wait(r), 2) for r in ran["reports"]],
        "spread": round((max(speeds) - min(speeds)) / middle, 4) if middle else None,
        "generate_s": round(sum(f["generate_s"] for f in each), 2),
        "engine_startup_s": round(
            ran.get("startup_s", 0.0) + sum(f["engine_startup_s"] for f in each), 2
        ),
        "records_answered": sum(f["records_answered"] for f in each),
        "round_records": min(f["records_answered"] for f in each),
    }
    # the engine's peaks cover every round it ran; the last round's counters are its own
    measured = measured_limit(ran["reports"][-1], ran["spec"])
    found["bound_by"] = measured["bound_by"]
    found["limit"] = {"measured": measured}
    return found


def measure_candidate(
    job: Any, candidate: Candidate, samples: list[Path], sizing: Sizing, base: dict, folder: Path
) -> dict[str, Any]:
    """``candidate`` run in rounds into ``folder`` and compared with the reference
    (measured first: its answers on ``base["compared"]``'s records, those whose answers
    are deterministic, and its correctness go into ``base``). ``job``: the
    ``tuning.tune.TuneJob``."""
    from nightshift.tuning.binding import predicted_limit

    entry: dict[str, Any] = {"name": candidate.name, "sets": candidate.sets, "output": str(folder)}
    entry["same_answers"] = same_answers(candidate)
    ran = run_rounds(job.data, candidate, samples, folder, fresh=not sizing.disjoint)
    if "error" in ran:
        return {**entry, "error": ran["error"]}
    cost = job.spec.cost
    entry.update(round_figures(ran, cost.usd_per_gpu_hour, cost.gpus))
    first = ran["outputs"][0]
    entry["limit"]["predicted"] = predicted_limit(ran["spec"], first, ran["reports"][0], job.gpu)
    why = not_measurable(sizing, entry["limit"]["measured"]["batch_reached"])
    if why:
        entry["not_measurable"] = why
    got, right = outputs_answers(ran["outputs"], job.spec)
    if candidate.name == REFERENCE:
        compared = base.get("compared")
        kept = {i: a for i, a in got.items() if compared is None or i in compared}
        base.update(answers=kept, right=right)
        entry["is_job"] = job_is_reference(job.spec, job.data)
    entry.update(agreement_figures(base.get("answers", {}), got))
    if entry["agreement"] is None and base.get("why"):
        entry["nothing_to_compare"] = base["why"]
    entry.update(quality_figures(base.get("right"), right))
    return entry


# Keys that move speed or memory only: a candidate setting nothing else answers as the
# job does by design (jobs.fingerprint leaves them out), compared or not.
SPEED_ONLY = frozenset(
    {"engine.max_num_seqs", "engine.max_num_batched_tokens", "engine.gpu_memory_utilization"}
)


def same_answers(candidate: Candidate) -> bool:
    """Whether ``candidate`` changes only keys that never change answers."""
    from nightshift.jobs.fingerprint import HARMLESS_ENGINE_EXTRA

    harmless = SPEED_ONLY | {f"engine.extra.{k}" for k in HARMLESS_ENGINE_EXTRA}
    return all(key in harmless for key in candidate.sets)
