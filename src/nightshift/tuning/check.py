"""``jobs tune --check``: the whole job run under the chosen setting and under its own,
so the gain the tune predicted from its rounds is set beside the gain measured.

Both runs go through ``jobs run``'s steps (``pipelines.direct.run_job``) on the job's
whole input, each into its own folder under the tune's (``check/job``, ``check/chosen``),
the canary and the response cache off, as the tune's rounds run. The job's own setting
runs first. One run each: the check says how far the prediction was off, not the noise
of the full runs (the tune's rounds measured that).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nightshift.tuning.candidates import JOB, Candidate
from nightshift.tuning.measure import figures


def check_spec(data: dict[str, Any], candidate: Candidate, out: Path):
    """The job's spec under ``candidate``, over its whole input into ``out``."""
    from nightshift.jobs.loading import validate_spec

    data = candidate.applied(data)
    data["output"] = {**data.get("output", {}), "path": str(out)}
    data["cache"] = {**data.get("cache", {}), "path": None}
    data["run"] = {**(data.get("run") or {}), "canary": False}
    return validate_spec(data)


def run_check(job: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """tune.json's ``check``: the full job's tokens/s under its setting and the chosen
    one, the measured gain against the predicted. ``job``: the ``tuning.tune.TuneJob``."""
    chosen = summary.get("chosen")
    if chosen is None:
        return {"note": "nothing was chosen: nothing to check"}
    if chosen.get("is_job"):
        return {"note": "the job's own setting is kept: nothing to check"}
    runs = {}
    for name, candidate in (
        ("job", Candidate(JOB)),
        ("chosen", Candidate(chosen["name"], chosen["sets"])),
    ):
        found = _run_full(job, candidate, job.folder / "check" / name)
        if "error" in found:
            return {"error": f"{name}: {found['error']}"}
        runs[name] = found
    measured = runs["chosen"]["tokens_per_s"] / runs["job"]["tokens_per_s"]
    predicted = chosen.get("speedup_over_job")
    return {
        "chosen": chosen["name"],
        "predicted_gain": predicted,
        "measured_gain": round(measured, 3),
        "prediction_off_by": round(measured / predicted - 1, 4) if predicted else None,
        "job": runs["job"],
        "chosen_run": runs["chosen"],
    }


def _run_full(job: Any, candidate: Candidate, out: Path) -> dict[str, Any]:
    from nightshift.console import engine_output_to
    from nightshift.errors import NightshiftError
    from nightshift.pipelines.direct import run_job

    try:
        spec = check_spec(job.data, candidate, out)
        with engine_output_to(out.with_suffix(".log")):
            report = run_job(spec, overwrite=True, progress=False).report
    except (NightshiftError, RuntimeError, ValueError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    cost = job.spec.cost
    found = figures(report, cost.usd_per_gpu_hour, cost.gpus)
    return {"output": str(out), **found}


def check_line(check: dict[str, Any]) -> str:
    """The check in one line, for the terminal and tune.md."""
    if "note" in check or "error" in check:
        return f"check: {check.get('note') or check.get('error')}"
    job, chosen = check["job"], check["chosen_run"]
    predicted = check["predicted_gain"]
    said = f"predicted {predicted:.2f}x" if predicted else "no prediction"
    return (
        f"check: the full job ran {chosen['tokens_per_s']:,.0f} tokens/s under "
        f"{check['chosen']} against {job['tokens_per_s']:,.0f} under its own setting: "
        f"{check['measured_gain']:.2f}x measured, {said}"
    )
