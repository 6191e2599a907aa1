"""The plan step by step: each step's time and memory, at several sizes of the same job.

Builds the plan of ``run_path.py``'s classify job (the demo's tickets, the real SmolLM2
tokenizer) in a fresh process per size, and around each step of
``scheduling.plan._build_plan`` (and of ``prefixes.shared_blocks``) records its seconds,
the process's resident memory before and after, and its high-water mark during the step
(``VmHWM``, reset before each step through ``/proc/self/clear_refs``; Linux only). A step
whose time or peak grows faster than the records shows here first.

    .venv/bin/python benchmarks/plan_steps.py --records 100000 1000000 3000000

``--processes 1 --lend no yes --reps 2`` starts that many encoding processes just
before each plan, as a run starts them for its feed (``running.encoding``), and plans
each size with them lent to the plan (``yes``: ``scheduling.helpers``) or not, sides
alternated (no yes yes no ...): on either side they load their tokenizers beside the
plan, which waits for none of them.

Writes benchmarks/results/plan_steps.json (``--out`` for another file).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PLAN_STEPS = [
    "measure_input", "_reject_duplicate_ids", "_set_rejects_apart", "split_copies",
    "shared_blocks", "prefix_levels", "predicted_cached", "order_records", "cut_shards",
    "place_copies",
]  # fmt: skip
SHARING_STEPS = ["depth_of", "_next_chunks", "_node_table", "leaves_of"]


def memory() -> dict[str, float]:
    """This process's resident memory and its high-water mark, in GB (1e9 bytes)."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value = line.split(":")
            found[name] = int(value.split()[0]) * 1024 / 1e9
    return found


def watched(module, name: str, steps: list[dict]) -> None:
    """``module.name`` replaced by itself, timed and its memory recorded in ``steps``."""
    step = getattr(module, name)

    @functools.wraps(step)
    def timed(*args, **kwargs):
        before, inner = memory()["VmRSS"], len(steps)
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here
        started = time.perf_counter()
        result = step(*args, **kwargs)
        after = memory()
        # a step within this one reset the mark: its own peak counts here too
        peak = max([after["VmHWM"], *(s["peak_gb"] for s in steps[inner:])])
        steps.append({
            "step": name,
            "s": round(time.perf_counter() - started, 2),
            "rss_before_gb": round(before, 3),
            "peak_gb": round(peak, 3),
            "rss_after_gb": round(after["VmRSS"], 3),
        })  # fmt: skip
        return result

    setattr(module, name, timed)


def plan_once(spec_path: Path, processes: int, lend: bool) -> dict:
    """In this process: the plan of ``spec_path``, step by step, beside ``processes``
    encoding processes, lent to it or not."""
    import os

    import nightshift.scheduling.plan as plan
    import nightshift.scheduling.prefixes as prefixes
    from nightshift.jobs.loading import load_spec
    from nightshift.running import encoding

    steps: list[dict] = []
    for name in PLAN_STEPS:
        watched(plan, name, steps)
    for name in SHARING_STEPS:
        watched(prefixes, name, steps)
    spec = load_spec(spec_path)
    encoder = plan.load_encoder(spec)
    base = memory()["VmRSS"]
    os.environ["NIGHTSHIFT_ENCODE_PROCESSES"] = str(processes)
    started = time.perf_counter()
    encoding.start_spare(spec, encoder, 1_000_000)  # as a run does, just before its plan
    with encoding.lend_spare(spec) as lent:
        built = plan.build_plan(spec, encoder, progress=False, helpers=lent if lend else None)
    seconds = time.perf_counter() - started
    encoding.close_spare(spec)
    steps.append({"step": "(after the last step)", "peak_gb": round(memory()["VmHWM"], 3)})
    return {
        "records": built.records.height,
        "encoding_processes": processes,
        "lent_to_the_plan": lend,
        "jobs_sent_to_them": lent.sent if lent else 0,
        "plan_s": round(seconds, 1),
        "records_per_minute": round(built.records.height / seconds * 60),
        "rss_before_plan_gb": round(base, 3),
        "peak_gb": max(s["peak_gb"] for s in steps),
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "run_path")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/plan_steps.json")
    parser.add_argument("--processes", type=int, default=0)
    parser.add_argument("--lend", nargs="+", choices=["no", "yes"], default=["no"])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)  # a child's one plan
    args = parser.parse_args()
    if args.spec:
        print(json.dumps(plan_once(args.spec, args.processes, args.lend == ["yes"])))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_path import TOKENIZER, job_spec, make_tickets
    from sides import alternated

    if not TOKENIZER.exists():
        subprocess.run([str(ROOT / ".venv/bin/nightshift"), "demo", "init"], cwd=ROOT, check=True)
    sizes = []
    for records in args.records:
        inputs = make_tickets(args.cache, records)
        for lend in alternated(args.lend, args.reps):
            with tempfile.TemporaryDirectory(prefix="plan-steps-") as tmp:
                spec_path = Path(tmp) / "spec.yaml"
                spec = job_spec("classify", inputs, Path(tmp) / "out")
                spec_path.write_text(yaml.safe_dump(spec))
                # a fresh process a plan: its memory is the plan's, not the tickets' making
                child = [sys.executable, __file__, "--spec", str(spec_path)]
                child += ["--processes", str(args.processes), "--lend", lend]
                done = subprocess.run(child, check=True, capture_output=True, text=True)
            figures = {"input_records": records, **json.loads(done.stdout.splitlines()[-1])}
            print(json.dumps({k: v for k, v in figures.items() if k != "steps"}), flush=True)
            sizes.append(figures)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "the plan step by step", "job": "classify (run_path.py)"}
    args.out.write_text(json.dumps({**result, "sizes": sizes}, indent=2) + "\n")


if __name__ == "__main__":
    main()
