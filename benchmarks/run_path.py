"""The run path at GPU speed: nightshift's own cost per record, on the fake engine.

Tickets (the demo's, ``--records`` of them in 8 files) go through the commands users
run, on ``run.engine: fake`` (``configs/classify.yaml``'s job: scored labels, the real
SmolLM2 tokenizer; ``configs/embed.yaml``'s; a ``batch run`` of OpenAI chat lines, and
one of ``/v1/embeddings`` lines).
Each run is a subprocess; its report gives the split of its time (start-up, plan,
generation, wrap-up) and its process tree, sampled, its peak memory. Then the same
requests, read from the run's own plan and sampling, go through a fresh fake engine
alone: nightshift's own cost per record is the run's generation time less that engine
time, over the records. The same samples read each process's CPU time: the CPU µs a
record of the run's process, its encoding processes and its Prefect server while it
generates (on a machine of few cores they share them; on a GPU host each has its own).
``--kill-at 0.5`` also kills a run (SIGKILL, its whole process group) at half its
generation and times the rerun against the full run. ``--profile`` samples the thread
holding the GIL.

    nice -n 10 .venv/bin/python benchmarks/run_path.py --records 100000 [--records 1000000]
        [--jobs classify embed batch batch-embed] [--kill-at 0.5] [--profile]

Writes benchmarks/results/run_path.json (``--out`` for another file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NIGHTSHIFT = ROOT / ".venv" / "bin" / "nightshift"
TOKENIZER = ROOT / ".nightshift" / "smollm2-135m-instruct"


def make_tickets(folder: Path, records: int, files: int = 8) -> Path:
    """``records`` short demo tickets in ``files`` Parquet files, written once per size."""
    from nightshift.demo.tickets import write_tickets

    target = folder / f"tickets-{records}"
    if not (target / ".done").exists():
        target.mkdir(parents=True, exist_ok=True)
        write_tickets(target, count=records, files=files, seed=40)
        (target / ".done").touch()
    return target


def job_spec(kind: str, inputs: Path, output: Path) -> dict:
    """The example job of ``kind`` as a user runs it, on the fake engine."""
    spec = yaml.safe_load((ROOT / "configs" / f"{kind}.yaml").read_text())
    spec["input"]["path"] = str(inputs / "*.parquet")
    spec["model"]["path"] = str(TOKENIZER)
    spec["output"]["path"] = str(output)
    spec["run"] = {**spec.get("run", {}), "engine": "fake", "canary": False}
    spec.get("plan", {}).pop("shard_records", None)  # the default shard size
    spec.pop("eval", None) if kind != "classify" else None
    return spec


def batch_file(inputs: Path, path: Path, endpoint: str = "/v1/chat/completions") -> Path:
    """The tickets as OpenAI batch lines (one request a line): chat requests asking for a
    label, or (``/v1/embeddings``) the ticket to embed."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(inputs), format="parquet").to_table(columns=["ticket_id", "body"])
    with path.open("w") as out:
        for batch in table.to_batches(65_536):
            for tid, body in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                body_json: dict = {"model": TOKENIZER.name, "input": body}
                if endpoint != "/v1/embeddings":
                    content = f"Label: {body}"
                    body_json = {"model": TOKENIZER.name, "max_tokens": 8,
                                 "messages": [{"role": "user", "content": content}]}  # fmt: skip
                line = {"custom_id": tid, "method": "POST", "url": endpoint, "body": body_json}
                out.write(json.dumps(line) + "\n")
    return path


class TreeMemory:
    """The peak resident memory of a process and its descendants, sampled twice a second:
    the run's own process and, apart, the largest of the others (its Prefect server, its
    encoding processes). Each sample also reads their CPU seconds so far (``cpu``)."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.root, self.peak_run, self.peak_tree, self.peak_other = psutil.Process(pid), 0, 0, 0
        self.cpu: list[tuple[float, float, float, float]] = []  # time, run, encoding, Prefect
        self._last: dict[int, tuple[str, float]] = {}  # each child's last reading (ended ones too)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            try:
                run = self.root.memory_info().rss
                children = self.root.children(recursive=True)
                others = [p.memory_info().rss for p in children]
                self.cpu.append((time.time(), _cpu(self.root), *self._children_cpu(children)))
            except psutil.Error:
                continue
            self.peak_run = max(self.peak_run, run)
            self.peak_other = max([self.peak_other, *others])
            self.peak_tree = max(self.peak_tree, run + sum(others))

    def _children_cpu(self, children) -> tuple[float, float]:
        """CPU seconds of the encoding processes (and any other child) and of the Prefect
        server, ended ones included at their last reading."""
        import psutil

        for child in children:
            with contextlib.suppress(psutil.Error):
                kind = "prefect" if "uvicorn" in " ".join(child.cmdline()) else "encoding"
                self._last[child.pid] = (kind, _cpu(child))
        readings = self._last.values()
        return (
            sum(c for kind, c in readings if kind == "encoding"),
            sum(c for kind, c in readings if kind == "prefect"),
        )

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        gib = 2**30
        return {
            "peak_run_gib": round(self.peak_run / gib, 3),
            "peak_largest_child_gib": round(self.peak_other / gib, 3),
            "peak_all_processes_gib": round(self.peak_tree / gib, 3),
        }


def _cpu(process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def cpu_while_generating(samples: list[tuple], report: dict) -> dict | None:
    """CPU µs a record of the run's process, its encoding processes and its Prefect server
    between its first answer and its last (the sampled readings nearest inside them)."""
    from datetime import datetime

    timeline = report.get("timeline") or {}
    if "first_answer_s" not in timeline or "last_answer_s" not in timeline:
        return None
    began = datetime.fromisoformat(timeline["started_at"]).timestamp()
    window = [
        s
        for s in samples
        if began + timeline["first_answer_s"] <= s[0] <= began + timeline["last_answer_s"]
    ]
    if len(window) < 2:
        return None
    first, last = window[0], window[-1]
    records = report["this_run"]["records_answered"]
    share = (last[0] - first[0]) / max(1e-9, timeline["last_answer_s"] - timeline["first_answer_s"])
    per_record = [
        round(1e6 * (b - a) / (share * records), 1)
        for a, b in zip(first[1:], last[1:], strict=True)
    ]
    return dict(
        zip(("run_process", "encoding_processes", "prefect_server"), per_record, strict=True)
    )


def run_command(command: list[str], log: Path, kill_when=None) -> dict:
    """Run ``command`` to its end, or SIGKILL its process group once ``kill_when()``."""
    env = {**os.environ, "NIGHTSHIFT_FAKE_FAST": "1", "PREFECT_LOGGING_LEVEL": "WARNING"}
    began = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        memory = TreeMemory(process.pid)
        while kill_when is not None and process.poll() is None and not kill_when():
            time.sleep(0.2)
        if process.poll() is None and kill_when is not None:
            os.killpg(process.pid, signal.SIGKILL)
        rc = process.wait()
    wall = time.monotonic() - began
    if rc not in (0, -signal.SIGKILL):
        tail = log.read_text()[-3000:]  # the log's folder is gone once this exits
        raise SystemExit(f"{' '.join(command)} exited {rc}; its log ends:\n{tail}")
    # (not ru_maxrss: a child forked from this process counts this one's memory at fork)
    return {"wall_s": round(wall, 2), "returncode": rc, **memory.stop(), "cpu": memory.cpu}


def engine_alone(spec_path: Path, output: Path) -> dict:
    """The fake engine alone on the run's own requests (its plan, its sampling)."""
    from nightshift.engines.fake import FakeEngine
    from nightshift.io.outputs import JobOutput
    from nightshift.jobs.loading import load_spec
    from nightshift.jobs.tasks import embedding_dimension, sampling_for
    from nightshift.running.calibration import LabelCalibration
    from nightshift.running.feed import RequestFeed
    from nightshift.scheduling.plan import load_encoder

    spec = load_spec(spec_path)
    out = JobOutput(str(output))
    manifest = out.plans.manifest()
    encoder = load_encoder(spec)
    handler = LabelCalibration.for_run(spec, out.plans, manifest, encoder).handler
    sampling = sampling_for(spec, handler)
    feed = RequestFeed(spec, out.plans, encoder, sampling=sampling)
    began = time.perf_counter()  # reading, rendering and encoding alone, as the run does
    requests = list(feed.requests([s["index"] for s in manifest["shards"]["each"]]))
    encoding = time.perf_counter() - began
    feed.close()
    os.environ["NIGHTSHIFT_FAKE_FAST"] = "1"
    size = embedding_dimension(spec) if spec.task.kind == "embed" else 384  # as the run's
    engine = FakeEngine.from_environment(
        block_size=16, max_num_seqs=spec.engine.max_num_seqs or 256, embedding_size=size
    )
    began = time.perf_counter()
    answered = sum(1 for _ in engine.run(requests, sampling))
    seconds = time.perf_counter() - began
    return {"requests": answered, "seconds": round(seconds, 3), "encoding_s": round(encoding, 3)}


def figures(report: dict, alone: dict, run: dict) -> dict:
    """records/s, own µs a record while generating, and the fixed time's split."""
    t = report["time_s"]
    records = report["this_run"]["records_answered"]
    generate = t["generate"]
    return {
        "records": records,
        "wall_s": run["wall_s"],
        "records_per_s_end_to_end": round(records / run["wall_s"]),
        "records_per_s_generating": round(records / generate) if generate else None,
        "generate_s": round(generate, 2),
        "engine_alone_s": alone["seconds"],
        "engine_us_per_record": round(1e6 * alone["seconds"] / max(1, alone["requests"]), 2),
        "own_us_per_record": round(1e6 * (generate - alone["seconds"]) / max(1, records), 1),
        # of which the feed's reading, rendering and tokenizing, timed alone (a thread of
        # its own in the run, overlapping the rest: the two do not add up)
        "encode_us_per_record": round(1e6 * alone["encoding_s"] / max(1, records), 1),
        "fixed_s": {  # start-up: the process's own before the run's clock, and prepare
            "startup": round(run["wall_s"] - t["total"] + t["prepare"], 2),
            "plan": round(t["plan"], 2),
            "wrap_up": round(t["wrap_up"], 2),
        },
        "time_s": t,
    }


def run_job(kind: str, inputs: Path, work: Path, args) -> dict:
    """One job of ``kind`` over ``inputs``: its figures, and the kill-and-rerun's."""
    output = work / f"out-{kind}"
    spec_path = work / f"{kind}.yaml"
    spec_path.write_text(yaml.safe_dump(job_spec(kind, inputs, output), sort_keys=False))
    command = [str(NIGHTSHIFT), "jobs", "run", str(spec_path), "--overwrite"]
    if args.profile:  # collapsed stacks of the GIL holder, for flamegraph.pl or a grep
        where = str(args.cache / f"{kind}-{inputs.name}.prof")
        spy = [str(ROOT / ".venv/bin/py-spy"), "record", "-r", "100", "--threads", "--gil"]
        command = [*spy, "--format", "raw", "-o", where, "--", str(NIGHTSHIFT), *command[1:]]
    run = run_command(command, work / f"{kind}.log")
    report = json.loads((output / "report.json").read_text())
    result = figures(report, engine_alone(spec_path, output), run)
    result["peak_gib"] = run["peak_all_processes_gib"]
    result["memory"] = {k: v for k, v in run.items() if k.startswith("peak_")}
    # where the CPU goes while generating: on a GPU host each has cores of its own
    result["cpu_us_per_record_generating"] = cpu_while_generating(run["cpu"], report)
    if args.kill_at:
        result["kill_and_rerun"] = kill_and_rerun(command, result, output, work, kind, args)
    return result


BATCHES = {"batch": "/v1/chat/completions", "batch-embed": "/v1/embeddings"}


def run_batch(kind: str, inputs: Path, work: Path, args) -> dict:
    """``nightshift batch run`` on the tickets as OpenAI lines of ``kind``'s endpoint, on
    the fake engine; its own cost as for a job (generation time less the engine's)."""
    lines = batch_file(inputs, work / f"{kind}.jsonl", BATCHES[kind])
    output = work / f"{kind}-results.jsonl"
    command = [str(NIGHTSHIFT), "batch", "run", str(lines), str(output), "--model",
               str(TOKENIZER), "--set", "run.engine=fake", "--set", "run.canary=false"]  # fmt: skip
    run = run_command(command, work / f"{kind}.log")
    folder = Path(f"{output}.nightshift")
    report_path = folder / "job" / "report.json"
    report = json.loads(report_path.read_text())
    result = figures(report, engine_alone(folder / "job.yaml", folder / "job"), run)
    t = report["time_s"]
    outside = run["wall_s"] - t["total"] + t["prepare"]  # before the job's flow, and after
    # the output files are written after the job's report: the time between the two
    writing = output.stat().st_mtime - report_path.stat().st_mtime
    result["fixed_s"] = {
        # start-up, reading the file into a job, then writing the output files
        "outside_the_job": round(outside, 2),
        "write_output_files": round(writing, 2),
        "startup_and_read_file": round(outside - writing, 2),
        "plan": round(t["plan"], 2),
        "wrap_up": round(t["wrap_up"], 2),
    }
    return {**result, "peak_gib": run["peak_all_processes_gib"]}


def each_id_once(output: Path, inputs: Path) -> bool:
    """Whether every ticket is in exactly one of the committed results, failures and
    rejects (the files the markers and the plan name, never a listing)."""
    import polars as pl

    from nightshift.io.outputs import committed_files

    files = [
        f for kind in ("results", "failed", "rejects") for f in committed_files(str(output), kind)
    ]
    ids = pl.concat([pl.read_parquet(f, columns=["ticket_id"]) for f in files])["ticket_id"]
    wanted = pl.read_parquet(f"{inputs}/*.parquet", columns=["ticket_id"])["ticket_id"]
    return ids.len() == wanted.len() and ids.sort().equals(wanted.sort())


def kill_and_rerun(command: list[str], result: dict, output: Path, work: Path, kind, args):
    """SIGKILL a fresh run once ``--kill-at`` of its records are checkpointed or committed
    (``--kill-by records``), or at ``--kill-at`` of the full run's wall time (``--kill-by
    time``: a kill that may land in the plan), then rerun it to the end; the rerun's time
    against the full run's."""
    from nightshift.io.outputs import JobOutput

    out = JobOutput(str(output))

    def half_done() -> bool:  # by the records checkpointed or committed (a load-free clock)
        manifest = out.plans.manifest()
        if manifest is None:
            return False
        markers = out.shards.committed()
        done = sum(m["records"]["planned"] for m in markers.values())
        for shard in (s["index"] for s in manifest["shards"]["each"] if s["index"] not in markers):
            done += sum(f.rows for f in out.shards.checkpoint(shard))
        return done >= args.kill_at * result["records"]

    def half_time() -> bool:
        return time.monotonic() - began >= args.kill_at * result["wall_s"]

    shutil.rmtree(output)  # the full run's output would read as done at once
    began = time.monotonic()
    when = half_time if args.kill_by == "time" else half_done
    killed = run_command(command, work / f"{kind}-killed.log", kill_when=when)
    at = time.monotonic() - began
    rerun = run_command(command[:-1], work / f"{kind}-rerun.log")  # resume, no --overwrite
    report = json.loads((output / "report.json").read_text())
    return {
        "killed_by": args.kill_by,
        "killed_at_s": round(at, 1),
        "killed": killed,
        "rerun_wall_s": rerun["wall_s"],
        "rerun_share_of_full": round(rerun["wall_s"] / result["wall_s"], 3),
        "rerun_records_answered": report["this_run"]["records_answered"],
        "each_input_id_once": each_id_once(output, args.cache / f"tickets-{args.records_now}"),
        "rerun_time_s": {k: round(v, 2) for k, v in report["time_s"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[100_000])
    parser.add_argument("--jobs", nargs="+", default=["classify"])
    parser.add_argument("--kill-at", type=float, default=None)
    parser.add_argument("--kill-by", choices=["records", "time"], default="records")
    parser.add_argument("--profile", action="store_true", help="py-spy record each run")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "run_path")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/run_path.json")
    args = parser.parse_args()
    results = []
    for records in args.records:
        inputs = make_tickets(args.cache, records)
        args.records_now = records
        with tempfile.TemporaryDirectory(prefix="run_path-", dir=args.cache) as tmp:
            for kind in args.jobs:
                run = partial(run_batch if kind in BATCHES else run_job, kind)
                result = {"job": kind, **run(inputs, Path(tmp), args)}
                print(json.dumps(result), flush=True)
                results.append(result)
    command = " ".join(["benchmarks/run_path.py", *sys.argv[1:]])
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    args.out.write_text(
        json.dumps({"command": command, "machine": machine, "runs": results}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
