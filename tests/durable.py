"""Helpers for the durable-output tests: run jobs in subprocesses, read what they left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nightshift.io.outputs import JobOutput, committed_files

NIGHTSHIFT = [sys.executable, "-m", "nightshift.cli"]


def run_cli(
    spec: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    # A run killed by a test holds its GPU slot until the lease ends: give each run its
    # own limit, so a rerun right after a kill does not wait for it.
    limit = {"NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}"}
    return subprocess.run(
        [*NIGHTSHIFT, "jobs", "run", str(spec), "-q", *args],
        env={**os.environ, **limit, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_table(output: JobOutput, uri: str) -> pa.Table:
    import tempfile

    key = uri.removeprefix(output.store.root + "/")
    with tempfile.TemporaryDirectory() as tmp:
        return pq.read_table(output.store.download(key, Path(tmp) / "f.parquet"))


def committed_ids(location: str, id_column: str) -> dict[str, list]:
    """Ids in the committed results, failures and rejects (markers only, never a listing)."""
    output = JobOutput(location)
    ids: dict[str, list] = {}
    for kind in ("results", "failed"):
        tables = [read_table(output, uri) for uri in committed_files(location, kind)]
        ids[kind] = [i for t in tables for i in t.column(id_column).to_pylist()]
    rejects = [read_table(output, uri) for uri in committed_files(location, "rejects")]
    ids["rejects"] = [i for t in rejects for i in t.column(id_column).to_pylist()]
    return ids


def assert_exactly_once(location: str, id_column: str, input_ids: list) -> None:
    """Every input id in exactly one of results, failed, rejects; every shard reconciles."""
    ids = committed_ids(location, id_column)
    everything = ids["results"] + ids["failed"] + ids["rejects"]
    assert sorted(everything, key=str) == sorted(input_ids, key=str), {
        k: len(v) for k, v in ids.items()
    }
    for marker in JobOutput(location).shards.committed().values():
        records = marker["records"]
        assert records["planned"] == records["ok"] + records["failed"]


def generated_prompts(log: Path) -> list[str]:
    """The prompts (``fake.prompt_digest``) a fake engine with ``NIGHTSHIFT_FAKE_LOG`` answered."""
    return log.read_text().split() if log.exists() else []


def shard_prompts(spec: dict[str, Any]) -> dict[int, set[str]]:
    """The prompt digests of each planned shard's records (request keys mean nothing
    outside their run, so the fake engine's log names prompts)."""
    from nightshift.engines.fake import prompt_digest
    from nightshift.jobs.loading import validate_spec
    from nightshift.running.feed import RequestFeed
    from nightshift.scheduling.plan import load_encoder

    job = validate_spec(spec)
    output = JobOutput(job.output.path)
    feed = RequestFeed(job, output.plans, load_encoder(job))
    shards = [s["index"] for s in output.plans.manifest()["shards"]["each"]]
    try:
        return {s: {prompt_digest(r.token_ids) for r in feed.requests([s])} for s in shards}
    finally:
        feed.close()


def report(location: str) -> dict[str, Any]:
    return json.loads(JobOutput(location).store.get_bytes("report.json"))


def start_until_checkpoint(command: list[str], location: str, timeout: float = 600):
    """Start ``nightshift COMMAND`` (its own GPU limit, as after a crash) and return the
    running process once the job in ``location`` holds a checkpoint."""
    import contextlib
    import time

    import psutil

    from nightshift.errors import UserError
    from nightshift.jobs.status import output_status

    limit = {"NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}"}
    cli = psutil.Popen(
        [*NIGHTSHIFT, *command, "-q"],
        env={**os.environ, **limit},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert cli.poll() is None, cli.stderr.read().decode()[-3000:]
        with contextlib.suppress(UserError):
            records = output_status(location)["records"]
            if records["ok"] + records["failed"]:
                return cli
        time.sleep(0.2)
    cli.kill()
    raise AssertionError("no checkpoint in time")


def kill_alone(cli, wait_s: float = 10) -> list[str]:
    """SIGKILL ``cli`` alone, as the OOM killer does; the names of its child processes
    still running ``wait_s`` later (killed then, so none leaks into the session). A
    zombie counts as dead: an orphan's new parent may never reap it."""
    import contextlib
    import signal
    import time

    import psutil

    children = cli.children(recursive=True)
    names = {c.pid: c.name() for c in children}
    os.kill(cli.pid, signal.SIGKILL)
    cli.wait(timeout=30)

    def running(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + wait_s
    while (left := [p for p in children if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return [names[p.pid] for p in left]


def output_status_or_empty(location: str) -> list[int]:
    """Shards committed so far (none if the plan never finished)."""
    from nightshift.errors import UserError
    from nightshift.jobs.status import output_status

    try:
        status = output_status(location)
    except UserError:
        return []
    return [s["index"] for s in status["each"] if s["state"] == "done"]


def tickets(count: int, subjects: int, repeats: int) -> list[dict]:
    """``count`` small tickets: ``subjects`` distinct subjects, bodies of 1 to ``repeats``
    words."""
    return [
        {
            "ticket_id": f"t{i:03d}",
            "subject": f"s{i % subjects}",
            "body": f"body {i} " * (1 + i % repeats),
        }
        for i in range(count)
    ]


def fake_job(models, tmp_path: Path, rows: list[dict], files: int, shard_records: int):
    """``rows`` in ``files`` input files of equal size, as a job on the fake engine with
    shards of ``shard_records`` and chunks of 8: its spec file, spec and input ids."""
    import yaml

    from .conftest import spec_dict, write_records

    size = len(rows) // files
    for n in range(files):
        write_records(tmp_path / "in" / f"p{n}.parquet", rows[n * size : (n + 1) * size])
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        tmp_path / "out",
        plan={"shard_records": shard_records},
        run={"chunk_records": 8, "engine": "fake"},
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path, spec, [r["ticket_id"] for r in rows]
