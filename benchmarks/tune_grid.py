"""``jobs tune --grid`` against a hand sweep of the same grid, over a whole job.

The job: N demo tickets classified by the tiny demo model (``.nightshift/demo-model``,
labels scored by their first token, true labels for the eval), the KV cache in the
model's dtype, batch limits 256 sequences and 8,192 tokens (vLLM's own on this CPU and
smaller GPUs). The grid: ``engine.max_num_seqs`` {16, 64, 256} x
``engine.max_num_batched_tokens`` {1024, 8192}, as in issue 41.

1. The hand sweep: ``nightshift jobs run`` once per grid point over the whole job (one
   engine each, canary off), its tokens/s over generation from report.json, and its
   answers compared with the job's own (the 256/8192 point).
2. The tune: ``nightshift jobs tune SPEC --no-defaults --grid --try ... --try ...``.

Written to JSON: each point's sweep tokens/s and agreement with the job's answers; tune's
pick, its sweep tokens/s against the best point among those with the job's answers (the
goal: within 5%); each candidate's sample (its rounds' generation seconds) against the
job's generation time in the sweep (the goal: at most 10%), and the whole tune's.

Needs ``nightshift demo init`` first. A full size takes minutes per point on a CPU:

    nice -n 10 .venv/bin/python benchmarks/tune_grid.py --records 10000 \\
        [--out benchmarks/results/tune_grid.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NIGHTSHIFT = str(ROOT / ".venv/bin/nightshift")
SEQS, TOKENS = (16, 64, 256), (1024, 8192)
JOB_POINT = (256, 8192)  # the job's own setting


def job_spec(tickets: Path, out: Path) -> dict:
    return {
        "name": "tune-grid",
        "input": {"path": str(tickets), "id_column": "ticket_id", "keep_columns": ["subject"]},
        "prompt": {
            "system": "Classify each support ticket as payment, defect, login or general.",
            "template": "{subject} {body}\n\nCategory:",
        },
        "task": {"kind": "classify", "labels": ["payment", "defect", "login", "general"]},
        "eval": {"label_column": "true_label"},
        "model": {"path": str(ROOT / ".nightshift/demo-model"), "max_model_len": 2048},
        "engine": {
            "kv_cache_dtype": "auto",
            "max_num_seqs": JOB_POINT[0],
            "max_num_batched_tokens": JOB_POINT[1],
        },
        "run": {"canary": False},
        "sampling": {"max_tokens": 8, "temperature": 0.0},
        "output": {"path": str(out)},
        "cost": {"gpu": "h100", "gpus": 1, "usd_per_gpu_hour": 2.99},
    }


def run(cmd: list[str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.perf_counter() - began


def labels(out: Path) -> dict:
    import polars as pl

    rows = pl.read_parquet(out / "results" / "*.parquet")
    return dict(zip(rows["ticket_id"].to_list(), rows["label"].to_list(), strict=True))


def sweep(spec: Path, tmp: Path) -> dict:
    """Each grid point over the whole job: tokens/s over generation, and its labels."""
    points = {}
    for seqs in SEQS:
        for tokens in TOKENS:
            out = tmp / f"sweep-{seqs}-{tokens}"
            wall = run(
                [NIGHTSHIFT, "jobs", "run", str(spec), "-q", "--set", f"output.path={out}"]
                + ["--set", f"engine.max_num_seqs={seqs}"]
                + ["--set", f"engine.max_num_batched_tokens={tokens}"]
            )
            report = json.loads((out / "report.json").read_text())
            t = report["tokens"]
            generate = report["time_s"]["generate"]
            points[(seqs, tokens)] = {
                "tokens_per_s": round((t["prompt"] + t["output"]) / generate, 1),
                "generate_s": round(generate, 2),
                "wall_s": round(wall, 1),
                "labels": labels(out),
            }
    same = points[JOB_POINT]["labels"]
    for found in points.values():
        got = found.pop("labels")
        found["agreement_with_job"] = round(
            sum(got.get(i) == v for i, v in same.items()) / len(same), 4
        )
    return points


def tune(spec: Path, tmp: Path) -> tuple[dict, float]:
    folder = tmp / "tune"
    tries = ["--try", "engine.max_num_seqs=" + ",".join(map(str, SEQS))]
    tries += ["--try", "engine.max_num_batched_tokens=" + ",".join(map(str, TOKENS))]
    wall = run(
        [NIGHTSHIFT, "jobs", "tune", str(spec), "--no-defaults", "--grid", *tries]
        + ["--dir", str(folder)]
    )
    return json.loads((folder / "tune.json").read_text()), wall


def point_of(sets: dict) -> tuple[int, int]:
    return (
        int(sets.get("engine.max_num_seqs", JOB_POINT[0])),
        int(sets.get("engine.max_num_batched_tokens", JOB_POINT[1])),
    )


def verdict(points: dict, summary: dict) -> dict:
    """Tune's pick against the sweep's best among the settings with the job's answers,
    and its sample cost against the job's generation time in the sweep."""
    same = {p: f for p, f in points.items() if f["agreement_with_job"] == 1.0}
    best = max(same, key=lambda p: same[p]["tokens_per_s"])
    chosen = summary.get("chosen") or {}
    pick = point_of(chosen.get("sets") or {}) if chosen else None
    job_generate = points[JOB_POINT]["generate_s"]
    ran = [c for c in summary["candidates"] if "error" not in c]
    shares = {c["name"]: round(c["generate_s"] / job_generate, 4) for c in ran}
    ratio = points[pick]["tokens_per_s"] / same[best]["tokens_per_s"] if pick else None
    return {
        "sweep_best_same_answers": {"point": list(best), **same[best]},
        "tune_pick": {"point": list(pick) if pick else None, "why": chosen.get("why")},
        "pick_over_best": ratio and round(ratio, 4),
        "predicted_gain": chosen.get("speedup_over_job"),
        "sweep_gain": pick
        and round(points[pick]["tokens_per_s"] / points[JOB_POINT]["tokens_per_s"], 4),
        "pick_within_5_percent": bool(ratio and ratio >= 0.95),
        "sample_share_of_job_generate": shares,
        "sample_within_10_percent": max(shares.values()) <= 0.10,
        "tune_share_of_job_generate_all_candidates": round(
            sum(c["generate_s"] for c in ran) / job_generate, 4
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/tune_grid.json"))
    args = parser.parse_args()
    from nightshift.demo.tickets import write_tickets

    with tempfile.TemporaryDirectory(prefix="ns-tune-grid-") as tmp_name:
        tmp = Path(tmp_name)
        write_tickets(tmp / "tickets", count=args.records, files=4)
        spec = tmp / "job.yaml"
        spec.write_text(yaml.safe_dump(job_spec(tmp / "tickets", tmp / "job")))
        began = time.perf_counter()
        points = sweep(spec, tmp)
        sweep_s = time.perf_counter() - began
        summary, tune_s = tune(spec, tmp)
    result = {
        "benchmark": "tune_grid",
        "machine": platform.processor() or platform.machine(),
        "records": args.records,
        "sweep": {f"{s}/{t}": f for (s, t), f in points.items()},
        "sweep_wall_s": round(sweep_s, 1),
        "tune_wall_s": round(tune_s, 1),
        **verdict(points, summary),
        "tune": summary,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    shown = {k: v for k, v in result.items() if k not in ("tune", "sweep")}
    print(json.dumps({**shown, "sweep": result["sweep"]}, indent=2))


if __name__ == "__main__":
    main()
