"""A CLI killed alone (the OOM killer, ``kill -9``) takes its engine processes with it:
no vLLM EngineCore (nor its worker) is left holding the accelerator, and the rerun
resumes with every record exactly once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid

import psutil
import pyarrow.parquet as pq
import pytest

from nightshift.errors import UserError
from nightshift.jobs.status import output_status

from .conftest import spec_dict
from .durable import NIGHTSHIFT, assert_exactly_once, run_cli


def start_and_wait_for_checkpoint(spec, location: str, timeout: float = 300) -> psutil.Popen:
    limit = {"NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}"}
    cli = psutil.Popen(
        [*NIGHTSHIFT, "jobs", "run", str(spec), "-q"],
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


def survivors(processes: list[psutil.Process], wait_s: float) -> list[psutil.Process]:
    """Those still running after ``wait_s`` (a zombie is dead: an orphan's new parent
    may never reap it)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in processes if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.engine
def test_a_cli_killed_alone_leaves_no_engine_behind_and_the_rerun_resumes(
    models, ticket_dir, write_spec, tmp_path
):
    out = tmp_path / "out"
    spec = write_spec(
        {
            **spec_dict(models["chat"], ticket_dir, out),
            "plan": {"shard_records": 40},
            "run": {"chunk_records": 8},
        }
    )
    cli = start_and_wait_for_checkpoint(spec, str(out))
    children = cli.children(recursive=True)
    names = {c.pid: c.name() for c in children}
    assert children, "the engine runs in a child process"
    os.kill(cli.pid, signal.SIGKILL)  # the CLI alone, as the OOM killer does
    cli.wait(timeout=30)
    left = survivors(children, wait_s=10)
    for process in left:  # do not leak them into the rest of the session
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    assert not left, f"outlived the CLI: {[names[p.pid] for p in left]}"

    # The resume itself needs no second real engine (real-engine resumes: test_pipelines).
    rerun = run_cli(spec, "--set", "run.engine=fake")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    ids = pq.read_table(ticket_dir).column("ticket_id").to_pylist()
    assert_exactly_once(str(out), "ticket_id", ids)
