"""Start-up overlap: what starting the engine while the plan is built saves, end to end.

The same job runs through ``nightshift jobs run`` (a subprocess: the command users
type, a fresh vLLM engine each time) with the engine started while the plan is built
(the default) and with ``run.overlap_startup=false`` (the engine started only after the
plan is written), sides alternated (A B B A ...), each in a fresh output. Wall time
counts from the command to its exit, the report written.

The job is one whose plan takes 10 s or more while generation stays short on a CPU:
``--records`` demo tickets made of ``--distinct`` different tickets repeated under new
ids. The plan reads, renders and counts every record; dedup sends only the distinct
ones to the engine. The figure is the share of the plan time the overlap saves:
``(wall_after_plan - wall_overlapped) / plan_s``, goal 80% or more.

    .venv/bin/python benchmarks/overlap.py [--records 900000] [--distinct 300] [--reps 2]

Writes benchmarks/results/overlap.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from sides import alternated

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"overlapped": [], "after_plan": ["run.overlap_startup=false"]}
# From the report: "prepare" is nightshift's and Prefect's start-up before planning,
# where the overlapped side's engine already starts (pipelines.headstart).
TIMES = ("prepare", "plan", "engine_startup", "startup_during_plan")


def make_input(records: int, distinct: int, directory: Path) -> Path:
    """``records`` tickets: ``distinct`` demo tickets, repeated in turn under new ids."""
    from nightshift.demo.tickets import tickets

    originals = [{**t, "body": t["body"][:1500]} for t in tickets(distinct, seed=7)]
    columns = {name: [] for name in originals[0]}
    for i in range(records):
        for name, value in originals[i % distinct].items():
            columns[name].append(f"t{i:07d}" if name == "ticket_id" else value)
    path = directory / "in" / "tickets.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table(columns), path, row_group_size=50_000)
    return path.parent


def run_side(side: str, inputs: Path, tmp: Path) -> dict:
    """One ``nightshift jobs run`` of the job, timed from the command to its exit."""
    output = tmp / f"{side}-{time.monotonic_ns()}"
    overrides = [f"input.path={inputs}", f"output.path={output}", "run.engine=vllm"]
    overrides += ["plan.shard_records=100000", *SIDES[side]]
    command = [sys.executable, "-m", "nightshift.cli", "jobs", "run", "configs/classify.yaml"]
    for item in overrides:
        command += ["--set", item]
    began = time.perf_counter()
    subprocess.run([*command, "-q"], cwd=ROOT, check=True, env=os.environ.copy())
    wall = time.perf_counter() - began
    report = json.loads((output / "report.json").read_text())
    times = report["time_s"]
    return {
        "wall_s": round(wall, 2),
        **{k: round(times.get(k, 0.0), 2) for k in TIMES},
        "generate_s": round(times["generate"], 2),
        "records": report["records"]["input"],
    }


def figures(runs: dict[str, list[dict]]) -> dict:
    median = {side: statistics.median(r["wall_s"] for r in rs) for side, rs in runs.items()}
    plan_s = statistics.median(r["plan"] for r in runs["after_plan"])
    saved = median["after_plan"] - median["overlapped"]
    return {
        "median_wall_s": median,
        "median_plan_s": plan_s,
        "saved_s": round(saved, 2),
        "share_of_plan_saved": round(saved / plan_s, 3),
        "met": plan_s >= 10 and saved / plan_s >= 0.8,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=900_000)
    parser.add_argument("--distinct", type=int, default=300)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    order = alternated(list(SIDES), args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        inputs = make_input(args.records, args.distinct, Path(tmp))
        for side in order:
            runs[side].append(run_side(side, inputs, Path(tmp)))
            print(side, runs[side][-1], flush=True)
    result = {
        "benchmark": "nightshift jobs run: engine start-up overlapped with planning, or not",
        "command": " ".join(["benchmarks/overlap.py", *sys.argv[1:]]),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "job": {
            "records": args.records,
            "distinct": args.distinct,
            "spec": "configs/classify.yaml",
        },
        "runs": runs,
        **figures(runs),
    }
    out = ROOT / "benchmarks/results/overlap.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
