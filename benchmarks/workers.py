"""Scale-out: throughput with 1 and 2 workers, and the per-shard overhead.

Runs ``nightshift jobs run configs/classify.yaml --workers N`` on a subset of the demo
tickets into fresh outputs, the way a user would (Prefect flow, temporary server, one
vLLM engine per worker), and reads each run's report.json:

- 1 worker, ``--shards`` shards; 2 workers, the same shards: throughput side by side.
  On this 2-core CPU machine each of 2 workers gets one core, so the two together have
  the same arithmetic as one worker with both cores: the figure shows what scale-out
  costs, not what it gains. On GPUs each worker brings its own GPU.
- 1 worker with 4x fewer shards: the time difference over the shard-count difference
  is the per-shard overhead (claim, plan-file read, checkpoint merge, commit, lease),
  from which docs/benchmarks.md states the scaling to N GPUs.

    .venv/bin/python benchmarks/workers.py [--records 4000] [--shards 16]

Writes benchmarks/results/workers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead import subset  # benchmarks/ is the script's directory, so on sys.path

ROOT = Path(__file__).resolve().parents[1]


def run(tickets: Path, out: Path, workers: int, shard_records: int) -> dict:
    """One `jobs run` in a subprocess; its wall time and report figures."""
    command = [
        sys.executable,
        "-m",
        "nightshift.cli",
        "jobs",
        "run",
        "configs/classify.yaml",
        "-q",
        "--workers",
        str(workers),
        "--set",
        f"input.path={tickets}",
        "--set",
        f"output.path={out}",
        "--set",
        f"plan.shard_records={shard_records}",
    ]
    began = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env=os.environ.copy())
    wall = time.perf_counter() - began
    report = json.loads((out / "report.json").read_text())
    samples = report["timeline"]["samples"]
    final = samples[-1]["records"]
    first = next(x["t_s"] for x in samples if x["records"] > 0)
    last = next(x["t_s"] for x in samples if x["records"] >= final)
    return {
        "workers": workers,
        "shards": report["shards"]["count"],
        "records": report["this_run"]["records_answered"],
        "command_wall_s": wall,
        "time_s": report["time_s"],
        "tail_s": report["tail_s"],
        "total_tokens_per_s": report["throughput"]["total_tokens_per_s"],
        "records_per_s": report["throughput"]["records_per_s"],
        # From the first answer to the last: the engines' rate once they are up (worker
        # processes start, import vLLM and load the tokenizer before their engine starts).
        "busy_records_per_s": final / (last - first),
        "engine_starts": report["this_run"]["engine_starts"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=16)
    args = parser.parse_args()
    size = args.records // args.shards
    with tempfile.TemporaryDirectory(prefix="nightshift-bench-") as tmp:
        root = Path(tmp)
        tickets = subset(args.records, root)
        runs = [
            run(tickets, root / "one", 1, size),
            run(tickets, root / "two", 2, size),
            run(tickets, root / "one-few", 1, size * 4),
        ]
    many, few = runs[0], runs[2]
    extra_shards = many["shards"] - few["shards"]
    per_shard = (many["time_s"]["generate"] - few["time_s"]["generate"]) / max(extra_shards, 1)
    figures = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": runs,
        "speedup_2_workers": runs[1]["records_per_s"] / runs[0]["records_per_s"],
        "busy_speedup_2_workers": runs[1]["busy_records_per_s"] / runs[0]["busy_records_per_s"],
        "per_shard_overhead_s": per_shard,
        "note": "2 workers on 2 cores share the same arithmetic as 1 worker on 2 cores; "
        "per-shard overhead = extra generation time / extra shards (1 worker)",
    }
    target = ROOT / "benchmarks/results/workers.json"
    target.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
