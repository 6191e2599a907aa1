"""``jobs tune`` on the demo job, and what its sample costs beside the full job.

Runs ``nightshift jobs tune configs/classify.yaml`` (the command users run: every default
candidate, each its own engine, on a sample of the job's own records), then the full job
with ``nightshift jobs run`` (canary off, so its generation time is the job's alone), and
writes tune.json's figures with:

* ``chosen``: the setting tune picks and why (the job's own unless a candidate beats it
  beyond the rounds' spread), its predicted speed-up over the job and its agreement with
  the reference answers with the 95% interval;
* ``candidates``: per candidate, whether its rounds could show its batch limits
  (``measurable``), each round's tokens/s and their spread, agreement and its interval,
  the flips against the reference (right to wrong, wrong to right);
* ``sample_cost``: each candidate's generation seconds on its rounds against the full
  job's, as a share (the goal: at most 10%), tune's own prediction of it, and the whole
  tune's wall time against the full run's.

Needs ``nightshift demo init`` first.

    .venv/bin/python benchmarks/tune_demo.py [--out benchmarks/results/tune_demo.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NIGHTSHIFT = str(ROOT / ".venv/bin/nightshift")
SPEC = "configs/classify.yaml"


def timed(cmd: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/tune_demo.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ns-tune-") as tmp:
        folder, full = Path(tmp) / "tune", Path(tmp) / "full"
        tune_s = timed([NIGHTSHIFT, "jobs", "tune", SPEC, "--dir", str(folder)])
        summary = json.loads((folder / "tune.json").read_text())
        shutil.rmtree(full, ignore_errors=True)
        run_s = timed(
            [NIGHTSHIFT, "jobs", "run", SPEC, "-q", "--set", f"output.path={full}"]
            + ["--set", "run.canary=false"]
        )
        report = json.loads((full / "report.json").read_text())
    job_generate = report["time_s"]["generate"]
    ran = [c for c in summary["candidates"] if "error" not in c]
    chosen = summary.get("chosen") or {}
    picked = next((c for c in ran if c["name"] == chosen.get("name")), {})
    summary["benchmark"] = "tune_demo"
    summary["machine"] = platform.processor() or platform.machine()
    summary["chosen_figures"] = {
        "why": chosen.get("why"),
        "speedup_over_job": chosen.get("speedup_over_job"),
        "agreement": picked.get("agreement"),
        "agreement_ci": picked.get("agreement_ci"),
    }
    summary["candidate_figures"] = {
        c["name"]: {
            "measurable": not c.get("not_measurable"),
            "rounds_tokens_per_s": c.get("rounds_tokens_per_s"),
            "spread": c.get("spread"),
            "agreement": c.get("agreement"),
            "agreement_ci": c.get("agreement_ci"),
            "flips": c.get("flips"),
            "batch_reached": c["limit"]["measured"]["batch_reached"],
        }
        for c in ran
    }
    summary["sample_cost"] = {
        "full_job_generate_s": round(job_generate, 2),
        "full_job_wall_s": round(run_s, 1),
        "tune_wall_s": round(tune_s, 1),
        "candidates": len(summary["candidates"]),
        "share_of_job_generate": {
            c["name"]: round(c["generate_s"] / job_generate, 4) for c in ran if job_generate
        },
        "within_10_percent": bool(job_generate)
        and all(c["generate_s"] / job_generate <= 0.10 for c in ran),
        "tune_predicted": summary["sample"].get("cost"),
    }
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    shown = ("chosen", "chosen_figures", "candidate_figures", "sample_cost")
    print(json.dumps({k: summary[k] for k in shown}, indent=2))


if __name__ == "__main__":
    main()
