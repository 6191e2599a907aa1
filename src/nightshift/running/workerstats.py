"""What each worker of a scaled-out run counted, and how the report adds them up.

Every worker writes ``_work/workers/<worker>.json`` when it stops: its totals, its
engine's counters and start-up, its timeline and its shards' times, in wall-clock
seconds. The run that launched the workers merges them into one report; a worker that
was killed leaves no figures, but every shard it committed is still counted from the
commit markers (``report.output_section``).

``tail_s`` is the straggler figure: seconds from the moment 90% of the run's records
were answered to the moment all were. A short tail means the shards were small enough
for the workers to finish together.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from nightshift.engines.base import EngineInfo, EngineStats
from nightshift.running.totals import RunTotals

if TYPE_CHECKING:
    from nightshift.running.engines import EnginePool
    from nightshift.running.runner import JobRun

WORKERS_DIR = "_work/workers"


def write_worker_figures(job: JobRun, engines: EnginePool, worker: str) -> None:
    clock = job.progress
    clock.engines_started(engines.spans)  # when its engine began starting and was ready
    figures = {
        "worker": worker,
        "started_at": clock.started_at.timestamp(),
        "totals": {
            **asdict(job.runner.totals),
            "finish_reasons": dict(job.runner.totals.finish_reasons),
        },
        "committed": job.runner.committed,
        "failures": {str(s): e for s, e in job.runner.failures.items()},
        "engine": {
            "startup_s": engines.startup_s,
            "startups": clock.engine_startups,
            "starts": engines.starts,
            "stats": asdict(engines.stats),
            "info": asdict(engines.info) if engines.info else None,
            "placement": [{**p, "worker": worker} for p in engines.placements],
        },
        "samples": clock.samples,
        "shard_times": clock.shard_table(),
    }
    job.output.store.put_bytes(f"{WORKERS_DIR}/{worker}.json", json.dumps(figures).encode())


def read_worker_figures(job: JobRun, since: float) -> list[dict[str, Any]]:
    """The figures of workers that started after ``since`` (wall clock): this run's."""
    store = job.output.store
    found = [json.loads(store.get_bytes(k)) for k in store.list(f"{WORKERS_DIR}/")]
    return [f for f in found if f["started_at"] >= since]


def absorb_worker_figures(job: JobRun, engines: EnginePool, figures: list[dict]) -> None:
    """Load the workers' figures into the launching run's runner, engines and clock, so
    its report covers the work they did."""
    runner, base = job.runner, job.progress.started_at.timestamp()
    for f in figures:
        runner.totals = _add_totals(runner.totals, f["totals"])
        runner.committed += f["committed"]
        runner.failures.update({int(s): e for s, e in f["failures"].items()})
        engine = f["engine"]
        engines.stats = engines.stats.plus(EngineStats(**engine["stats"]))
        engines.startup_s = max(engines.startup_s, engine["startup_s"])  # they start together
        engines.starts += engine["starts"]
        engines.placements += engine.get("placement", [])  # an older worker's: none
        if engine["info"]:
            engines.info = EngineInfo(**engine["info"])
    committed = set(runner.committed)
    runner.failures = {s: e for s, e in runner.failures.items() if s not in committed}
    offsets = [f["started_at"] - base for f in figures]
    job.progress.samples = merge_samples([f["samples"] for f in figures], offsets)
    job.progress.engine_startups += [
        {k: round(v + off, 3) for k, v in s.items()}
        for f, off in zip(figures, offsets, strict=True)
        for s in f["engine"].get("startups", [])  # figures of an older worker lack them
    ]
    job.progress.shard_times = {
        t["shard"]: {k: v + (off if k.endswith("ed_s") else 0) for k, v in t.items()}
        for f, off in zip(figures, offsets, strict=True)
        for t in f["shard_times"]
    }


def _add_totals(totals: RunTotals, other: dict[str, Any]) -> RunTotals:
    reasons = totals.finish_reasons + Counter(other["finish_reasons"])
    summed = {k: getattr(totals, k) + v for k, v in other.items() if k != "finish_reasons"}
    return RunTotals(**summed, finish_reasons=reasons)


def merge_samples(series: list[list[dict]], offsets: list[float]) -> list[dict[str, float]]:
    """Add up workers' cumulative counts on one time axis (each worker's last sample
    holds until its next)."""
    keys = ("records", "prompt_tokens", "output_tokens")
    points = sorted(
        (s["t_s"] + off, i, s)
        for i, (samples, off) in enumerate(zip(series, offsets, strict=True))
        for s in samples
    )
    latest: dict[int, dict] = {}
    merged = []
    for t, worker, sample in points:
        latest[worker] = sample
        merged.append({"t_s": round(t, 3), **{k: sum(s[k] for s in latest.values()) for k in keys}})
    return merged


def tail_seconds(samples: list[dict[str, float]], share: float = 0.9) -> float | None:
    """Seconds from ``share`` of the run's records answered to all of them."""
    if not samples or not samples[-1]["records"]:
        return None
    final = samples[-1]["records"]
    t_all = next(s["t_s"] for s in samples if s["records"] >= final)
    t_share = next(s["t_s"] for s in samples if s["records"] >= share * final)
    return t_all - t_share
