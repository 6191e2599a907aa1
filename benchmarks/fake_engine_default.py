"""A user's fake run: `nightshift jobs run` on `run.engine: fake` with no NIGHTSHIFT_FAKE_*
variable set, from two source trees (say the commit before a change and after it),
alternating, so the machine's drift falls on both sides alike.

    .venv/bin/python benchmarks/fake_engine_default.py --before /tmp/base/src \
        --after src --records 100000 --rounds 3   # -> fake_engine_default.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from run_path import NIGHTSHIFT, ROOT, job_spec, make_tickets

RESULTS = ROOT / "benchmarks" / "results"


def one_run(spec: Path, output: Path, source: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTSHIFT_FAKE")}
    env["PYTHONPATH"] = str(Path(source).resolve())
    began = time.perf_counter()
    command = [str(NIGHTSHIFT), "jobs", "run", str(spec), "--overwrite"]
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - began
    report = json.loads((output / "report.json").read_text())
    generate, answered = report["time_s"]["generate"], report["this_run"]["records_answered"]
    return {
        "wall_s": round(wall, 2),
        "generate_s": round(generate, 2),
        "records_per_s_generating": round(answered / generate),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a source tree (its src folder)")
    parser.add_argument("--after", default=str(ROOT / "src"))
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--job", default="classify")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "run_path")
    parser.add_argument("--out", type=Path, default=RESULTS / "fake_engine_default.json")
    args = parser.parse_args()
    inputs = make_tickets(args.cache, args.records)
    runs: dict[str, list] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="fake_default-", dir=args.cache) as tmp:
        output, spec = Path(tmp, "out"), Path(tmp, f"{args.job}.yaml")
        spec.write_text(yaml.safe_dump(job_spec(args.job, inputs, output), sort_keys=False))
        for _ in range(args.rounds):
            for side in ("before", "after"):
                runs[side].append(one_run(spec, output, getattr(args, side)))
                print(side, runs[side][-1], flush=True)
    speeds = {side: sorted(r["records_per_s_generating"] for r in runs[side]) for side in runs}
    median = {side: speeds[side][args.rounds // 2] for side in runs}
    result = {
        "command": " ".join(["benchmarks/fake_engine_default.py", *sys.argv[1:]]),
        "records": args.records,
        "job": args.job,
        "runs": runs,
        "after_over_before_records_per_s": round(median["after"] / median["before"], 2),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
