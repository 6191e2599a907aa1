"""Soak: random kills, SIGKILL and SIGTERM mixed, each followed by a rerun; records lost
and duplicated (the goal is 0 and 0).

Each kill point is one trial on a fresh output: ``nightshift jobs run`` starts in a
subprocess, gets SIGKILL (with its whole process tree, as when a machine dies) or
SIGTERM (the process alone, as a spot reclaim or a Kubernetes eviction sends it) at a
random moment, then the same command runs again to completion. The committed output
(markers only: results, failed, rejects) is then read back:

- lost: an input id in no output state;
- duplicated: an id in more than one row;
- redone (information, not a fault): records the rerun answered that the output already
  held after the kill (``this_run.records_answered`` against what was checkpointed), and
  on the fake engine the records generated in both runs (its ``NIGHTSHIFT_FAKE_LOG``):
  answers a SIGKILL took with it before they were checkpointed.

Most trials run on the fake engine (``run.engine=fake``, slowed with
``NIGHTSHIFT_FAKE_SECONDS_PER_RECORD`` so that kills land in planning, generation,
checkpoints, commits and the report alike), half on local output and half on S3
(SeaweedFS on loopback, tests/s3server.py); ``--real`` of them on real vLLM, killed
while it generates. A SIGTERMed run gets ``--term-wait`` seconds to exit before it is
SIGKILLed; the figures say how many exited on their own, how fast, and with what code.

    nice -n 10 .venv/bin/python benchmarks/soak.py [--kills 100] [--real 4] [--seed 15]

Writes benchmarks/results/soak.json.
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
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/: the durable-output and S3 server helpers

from benchmarks.soakproc import held, kill_all, start, stop, tree, wait_for  # noqa: E402
from tests.conftest import spec_dict  # noqa: E402
from tests.durable import committed_ids, generated_prompts  # noqa: E402
from tests.s3server import running_seaweedfs  # noqa: E402

FAKE_SECONDS_PER_RECORD = 0.01


def make_inputs(root: Path, records: int) -> tuple[Path, Path, list[str]]:
    """The demo model (tiny, built here) and ``records`` demo tickets, two of them over
    the context (rejects); their ids."""
    from nightshift.demo.model import build_model
    from nightshift.demo.tickets import corpus, tickets

    model = build_model(root / "model", corpus())
    rows = [{**t, "body": t["body"][:1500]} for t in tickets(records, seed=15)]
    for row in rows[7 :: records // 2]:
        row["body"] = "long " * 3000
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "in").mkdir()
    half = records // 2
    pq.write_table(pa.Table.from_pylist(rows[:half]), root / "in" / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[half:]), root / "in" / "b.parquet")
    return model, root / "in", [r["ticket_id"] for r in rows]


def write_spec(root: Path, model: Path, inputs: Path, output: str, engine: str) -> Path:
    spec = spec_dict(
        model,
        inputs,
        output,
        name="soak",
        plan={"shard_records": 50},
        run={"chunk_records": 10, "engine": engine},
    )
    path = root / f"spec-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_env(extra: dict[str, str]) -> dict[str, str]:
    # A killed run holds its GPU slot until the slot's lease ends: each run its own.
    limit = {"NIGHTSHIFT_GPU_LIMIT": f"soak-gpu-{uuid.uuid4().hex[:8]}"}
    return {**os.environ, **limit, **extra}


def fake_env(log: Path | None = None) -> dict[str, str]:
    """The fake engine's pace, and where it logs what it generated."""
    env = {"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": str(FAKE_SECONDS_PER_RECORD)}
    return {**env, "NIGHTSHIFT_FAKE_LOG": str(log)} if log else env


def report(output: str) -> dict | None:
    from nightshift.io.outputs import JobOutput

    return JobOutput(output).report()


def counts(output: str, ids: list[str]) -> dict:
    found = committed_ids(output, "ticket_id")
    seen = Counter(found["results"] + found["failed"] + found["rejects"])
    return {
        "lost": sum(1 for i in set(ids) if i not in seen),
        "duplicated": sum(n - 1 for n in seen.values() if n > 1),
        "ok": len(found["results"]),
        "failed": len(found["failed"]),
        "rejected": len(found["rejects"]),
    }


def trial(case: dict, inputs: tuple, work: Path, args: argparse.Namespace) -> dict:
    """One kill point and its rerun."""
    model, input_dir, ids = inputs
    name = f"t{case['index']:03d}"
    output = (
        f"s3://{case['bucket']}/soak/{name}" if case["store"] == "s3" else str(work / name / "out")
    )
    (work / name).mkdir()
    spec = write_spec(work / name, model, input_dir, output, case["engine"])
    first_log, second_log = work / name / "first.fake", work / name / "second.fake"
    began = time.monotonic()
    process = start(spec, run_env(fake_env(first_log)), work / name / "first.log")
    reached = wait_for(case["anchor"], output, process, args.rerun_timeout)
    anchored = time.monotonic()
    time.sleep(max(0.0, case["delay_s"] - (anchored - began if case["anchor"] == "start" else 0)))
    stopped = stop(process, case["signal"], args.term_wait)
    stopped["at_s"] = round(time.monotonic() - began, 2)
    stopped["anchor_reached"] = reached
    kept = held(output)
    killed_report = report(output)
    rerun, hung = rerun_to_completion(spec, fake_env(second_log), work / name, args.rerun_timeout)
    figures = report(output) or {}
    answered = figures.get("this_run", {}).get("records_answered")
    runnable = len(ids) - figures.get("records", {}).get("rejected", 0)
    result = {
        **{k: case[k] for k in ("index", "engine", "store", "signal", "anchor", "delay_s")},
        **stopped,
        "held_after_kill": kept,
        "rerun_returncode": rerun.returncode,
        "reruns_hung": hung,
        "rerun_records_answered": answered,
        # Records the output held after the kill and the rerun answered again: 0 expected.
        "redone_after_checkpoint": None if answered is None else answered - (runnable - kept),
        **counts(output, ids),
    }
    if killed_report:  # a SIGTERMed run that stopped gracefully writes its report
        result["killed_run_records_answered"] = killed_report["this_run"]["records_answered"]
    if case["engine"] == "fake":
        twice = set(generated_prompts(first_log)) & set(generated_prompts(second_log))
        result["generated_in_both_runs"] = len(twice)
    if rerun.returncode != 0:
        result["rerun_log"] = rerun.log[-2000:]
    return result


@dataclass
class Rerun:
    returncode: int
    log: str


def rerun_to_completion(spec: Path, env: dict, trial_dir: Path, timeout: float) -> tuple:
    """Run the job again until it exits; a rerun that hangs past ``timeout`` is killed
    with its tree and started once more (a hang is its own defect, not the kill's). The
    last rerun, and how many hung."""
    for hung in range(3):
        log = trial_dir / f"rerun-{hung}.log"
        process = start(spec, run_env(env), log)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_all(tree(process))
            process.wait()
            continue
        return Rerun(process.returncode, log.read_text(errors="replace")), hung
    return Rerun(process.returncode, log.read_text(errors="replace")), 3


def calibrate(inputs: tuple, work: Path, engine: str) -> dict:
    """One uninterrupted run: how long a run takes, so kill moments can span it."""
    model, input_dir, ids = inputs
    (work / f"calibrate-{engine}").mkdir()
    output = str(work / f"calibrate-{engine}" / "out")
    spec = write_spec(work / f"calibrate-{engine}", model, input_dir, output, engine)
    began = time.monotonic()
    process = start(spec, run_env(fake_env()), work / f"calibrate-{engine}" / "run.log")
    wait_for("plan", output, process)
    planned = time.monotonic()
    if process.wait(timeout=1800) != 0:
        raise SystemExit(f"the clean {engine} run failed: see {work}/calibrate-{engine}/run.log")
    wall = time.monotonic() - began
    figures = report(output)
    return {
        "engine": engine,
        "wall_s": round(wall, 2),
        "after_plan_s": round(began + wall - planned, 2),
        "generate_s": round(figures["time_s"]["generate"], 2),
        **counts(output, ids),
    }


def signal_for(index: int, engine: str, drawn: str) -> str:
    """The drawn signal; the few real-engine trials take both signals on both stores
    in turn (KILL local, KILL S3, TERM local, TERM S3), so each is measured."""
    return drawn if engine == "fake" else ["SIGKILL", "SIGTERM"][index // 2 % 2]


def plan_cases(args: argparse.Namespace, wall: dict[str, dict], bucket: str) -> list[dict]:
    """The kill points: engine, store, signal and moment of each, drawn from ``--seed``.

    A fifth of the fake engine's fall anywhere from the start to just after a clean
    run's end (start-up, planning, the plan's own writes); the rest from the moment the
    plan is written to just after the end (generation, checkpoints, commits, the
    report). The real engine's fall in its generation, after its first checkpoint."""
    rng = random.Random(args.seed)
    engines = ["vllm"] * args.real + ["fake"] * (args.kills - args.real)
    fake, cases = wall["fake"], []
    for index, engine in enumerate(engines):
        if engine == "vllm":
            anchor, delay = "checkpoint", rng.uniform(0.0, wall["vllm"]["generate_s"])
        elif rng.random() < 0.2:
            anchor, delay = "start", rng.uniform(0.0, 1.05 * fake["wall_s"])
        else:
            anchor, delay = "plan", rng.uniform(0.0, fake["after_plan_s"] + 1.0)
        cases.append(
            {
                "index": index,
                "engine": engine,
                "store": "s3" if index % 2 else "local",
                "signal": signal_for(index, engine, rng.choice(["SIGKILL", "SIGTERM"])),
                "anchor": anchor,
                "delay_s": round(delay, 2),
                "bucket": bucket,
            }
        )
    return cases


def run_trials(cases: list[dict], inputs: tuple, work: Path, args) -> list[dict]:
    """The fake engine's trials ``--jobs`` at a time, then the real engine's one by one
    (each vLLM engine wants the machine's cores)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(case: dict) -> dict:
        t = trial(case, inputs, work, args)
        print(
            f"{t['index']:3d} {t['engine']}/{t['store']} {t['signal']} at {t['at_s']} s "
            f"({t['anchor']} + {t['delay_s']} s): lost {t['lost']}, duplicated "
            f"{t['duplicated']}, redone {t['redone_after_checkpoint']}, rerun rc "
            f"{t['rerun_returncode']}",
            flush=True,
        )
        return t

    with ThreadPoolExecutor(args.jobs) as pool:
        trials = list(pool.map(one, [c for c in cases if c["engine"] == "fake"]))
    trials += [one(c) for c in cases if c["engine"] == "vllm"]
    return sorted(trials, key=lambda t: t["index"])


def summary(trials: list[dict]) -> dict:
    def part(rows: list[dict]) -> dict:
        term = [t for t in rows if t["signal"] == "SIGTERM" and not t["finished_before"]]
        return {
            "kills": len(rows),
            "finished_before_the_signal": sum(t["finished_before"] for t in rows),
            "reruns_failed": sum(t["rerun_returncode"] != 0 for t in rows),
            "reruns_hung": sum(t.get("reruns_hung", 0) for t in rows),
            "records_lost": sum(t["lost"] for t in rows),
            "records_duplicated": sum(t["duplicated"] for t in rows),
            "redone_after_checkpoint": sum(t["redone_after_checkpoint"] or 0 for t in rows),
            "reruns_that_redid_work": sum(
                (t.get("generated_in_both_runs") or t["redone_after_checkpoint"] or 0) > 0
                for t in rows
            ),
            "generated_in_both_runs": sum(t.get("generated_in_both_runs", 0) for t in rows),
            "sigterm": {
                "sent": len(term),
                "exited_on_its_own": sum(t["exited_on_its_own"] for t in term),
                "exit_s_max": max(
                    (t["exit_s"] for t in term if t["exited_on_its_own"]), default=None
                ),
                "returncodes": dict(Counter(str(t["returncode"]) for t in term)),
                "orphans_killed": sum(t["orphans_killed"] for t in term),
            },
        }

    groups = {
        f"{engine}/{store}": [t for t in trials if t["engine"] == engine and t["store"] == store]
        for engine in ("fake", "vllm")
        for store in ("local", "s3")
    }
    return {"all": part(trials), **{k: part(v) for k, v in groups.items() if v}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--real", type=int, default=4, help="kills on the real engine")
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=2, help="fake-engine trials at once")
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE for every run (repeatable)"
    )
    parser.add_argument("--rerun-timeout", type=float, default=600.0)
    parser.add_argument("--term-wait", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak.json")
    args = parser.parse_args()

    from prefect.testing.utilities import prefect_test_harness

    began = time.monotonic()
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        os.environ["PREFECT_HOME"] = str(work / "prefect-home")
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # room beside other work
        os.environ.update(dict(item.split("=", 1) for item in args.env))
        stack.enter_context(prefect_test_harness(server_startup_timeout=120))
        from prefect.settings import PREFECT_API_URL

        os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()  # one server for every run
        server = stack.enter_context(running_seaweedfs(work / "s3"))
        os.environ.update(server.env())
        os.environ["AWS_CONFIG_FILE"] = os.environ["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent"
        inputs = make_inputs(work, args.records)
        wall = {"fake": calibrate(inputs, work, "fake")}
        if args.real:
            wall["vllm"] = calibrate(inputs, work, "vllm")
        print("calibration:", json.dumps(wall), flush=True)
        trials = run_trials(plan_cases(args, wall, server.bucket), inputs, work, args)
    result = {
        "command": "nice -n 10 .venv/bin/python benchmarks/soak.py "
        f"--kills {args.kills} --real {args.real} --records {args.records} --seed {args.seed} "
        f"--jobs {args.jobs}" + "".join(f" --env {item}" for item in args.env),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "job": {
            "records": args.records,
            "shard_records": 50,
            "chunk_records": 10,
            "fake_seconds_per_record": FAKE_SECONDS_PER_RECORD,
        },
        "calibration": wall,
        "summary": summary(trials),
        "wall_s": round(time.monotonic() - began, 1),
        "trials": trials,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
