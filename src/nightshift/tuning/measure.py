"""One candidate of ``jobs tune``, run and measured: the job's own steps on the sample.

Each candidate is a whole job run (plan, engine start, shards, report) through the steps
``jobs run`` takes (``pipelines.direct.run_job``), into its own output under the tune's
folder, with the response cache off (a cached answer would time nothing). Its figures
come from that run's report.json; its answers are compared with the reference's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nightshift.jobs.loading import validate_spec
from nightshift.tuning.candidates import Candidate


def candidate_spec(data: dict[str, Any], candidate: Candidate, sample: Path, out: Path):
    """The job's spec (``data``, the user's overrides applied) as ``candidate`` runs it."""
    data = candidate.applied(data)
    data["input"] = {**data["input"], "path": str(sample)}
    data["output"] = {**data.get("output", {}), "path": str(out)}
    data["cache"] = {**data.get("cache", {}), "path": None}
    return validate_spec(data)


def figures(report: dict[str, Any], usd_per_gpu_hour: float, gpus: int) -> dict[str, Any]:
    """Speed and cost of a run's generation (start-up left out: a full job amortizes it)."""
    generate = max(report["time_s"]["generate"], 1e-9)
    tokens = report["tokens"]
    answered = report["records"]["ok"] + report["records"]["failed"]
    tokens_per_s = (tokens["prompt"] + tokens["output"]) / generate
    records_per_s = answered / generate
    usd_per_s = usd_per_gpu_hour * gpus / 3600
    return {
        "tokens_per_s": round(tokens_per_s, 2),
        "records_per_s": round(records_per_s, 3),
        "usd_per_million_tokens": round(usd_per_s / tokens_per_s * 1e6, 4)
        if tokens_per_s
        else None,
        "usd_per_1000_records": round(usd_per_s / records_per_s * 1e3, 4)
        if records_per_s
        else None,
        "generate_s": round(generate, 2),
        "engine_startup_s": round(report["time_s"].get("engine_startup", 0.0), 2),
        "records_answered": answered,
        "prefix_cache_hit_rate": report.get("prefix_cache_hit_rate"),
        "kv_cache_dtype": (report.get("engine") or {}).get("kv_cache_dtype"),
        "accuracy": (report.get("quality") or {}).get("accuracy"),
    }
