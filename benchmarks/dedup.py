"""Repeats and the response cache through ``nightshift jobs run`` on the real engine.

The demo tickets with 0%, 20% and 50% of records repeating another record's prompt under
a new id, each a fresh job on vLLM; then a second job over the 50% input plus 20% new
records, sharing the first's ``cache.path``. Each side is one ``nightshift jobs run``
(engine start-up included, as users see it); the figures are wall seconds, the prompts
the engine was sent (``report.json``'s engine counters and ``this_run``) and the rows.

    nice -n 10 .venv/bin/python benchmarks/dedup.py [--records 400]

Writes benchmarks/results/dedup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from nightshift.demo.model import build_model
from nightshift.demo.tickets import corpus, tickets

ROOT = Path(__file__).resolve().parents[1]


def _input(path: Path, base: list[dict], ratio: float, extra: list[dict]) -> None:
    """``base`` with ``ratio`` of its records replaced by repeats of others, plus ``extra``."""
    rng = random.Random(7)
    rows = [dict(r) for r in base]
    for i in rng.sample(range(len(rows)), int(len(rows) * ratio)):
        source = rows[rng.randrange(len(rows))]
        rows[i] = {**source, "ticket_id": f"r{i}"}
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows + extra), path)


def _run(spec: dict, work: Path, name: str) -> dict:
    spec = {**spec, "input": {**spec["input"], "path": str(work / name)}}
    spec["output"] = {"path": str(work / f"out-{name}")}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nightshift.cli", "jobs", "run", str(path), "-q"],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    wall = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(done.stderr)
    report = json.loads((work / f"out-{name}" / "report.json").read_text())
    return {
        "job": name,
        "wall_s": round(wall, 1),
        "generate_s": round(report["time_s"]["generate"], 2),
        "rows": report["records"]["ok"] + report["records"]["failed"],
        "copies": report["repeats"]["this_run"]["rows"],
        "cache_hits": report.get("response_cache", {}).get("hits", 0),
        "prompt_tokens_sent": report["this_run"]["tokens"]["prompt"],
        "output_tokens_generated": report["this_run"]["tokens"]["output"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nightshift-dedup-") as tmp:
        work = Path(tmp)
        model = build_model(work / "model", corpus())
        base = [{**t, "body": t["body"][:1500]} for t in tickets(args.records, seed=3)]
        fresh = [
            {**t, "ticket_id": f"new-{t['ticket_id']}", "body": t["body"][:1500] + " (again)"}
            for t in tickets(args.records // 5, seed=4)
        ]
        spec = {
            "name": "dedup-bench",
            "input": {"path": "", "id_column": "ticket_id"},
            "prompt": {"system": "Label the ticket.", "template": "Subject: {subject}\n\n{body}"},
            "task": {"kind": "classify", "labels": ["billing", "bug", "account", "other"]},
            "model": {"path": str(model), "max_model_len": 2048, "dtype": "float32"},
            "engine": {"max_num_seqs": 64, "extra": {"enforce_eager": True}},
            "sampling": {"max_tokens": 8},
            "output": {"path": ""},
            "cache": {"path": str(work / "cache")},
        }
        results = []
        for ratio in (0.0, 0.2, 0.5):
            name = f"dup{int(ratio * 100)}"
            _input(work / name / "p.parquet", base, ratio, [])
            no_cache = {**spec, "cache": {"path": str(work / f"cache-{name}")}}
            results.append({"duplicate_ratio": ratio, **_run(no_cache, work, name)})
        _input(work / "second" / "p.parquet", base, 0.5, fresh)
        shared = {**spec, "cache": {"path": str(work / "cache-dup50")}}
        results.append({"duplicate_ratio": 0.5, "second_job": True, **_run(shared, work, "second")})
    out = {"machine": platform.processor() or platform.machine(), "records": args.records}
    out["runs"] = results
    target = ROOT / "benchmarks" / "results" / "dedup.json"
    target.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
