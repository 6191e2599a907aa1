"""Soak's hands on the processes it kills: start a run, signal it (SIGKILL with its whole
tree, or SIGTERM and a grace period), wait for the moment a kill counts from."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

NIGHTSHIFT = [sys.executable, "-m", "nightshift.cli"]


def start(spec: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [*NIGHTSHIFT, "jobs", "run", str(spec), "-q"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=spec.parent,  # engine logs of S3 outputs go to ./.nightshift/logs
        )


def tree(process: subprocess.Popen) -> list[psutil.Process]:
    try:
        parent = psutil.Process(process.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_all(processes: list[psutil.Process]) -> int:
    """SIGKILL whatever of ``processes`` still lives; how many did."""
    killed = 0
    for p in processes:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                p.send_signal(signal.SIGKILL)
                killed += 1
        except psutil.NoSuchProcess:
            pass
    return killed


def stop(process: subprocess.Popen, how: str, term_wait: float) -> dict:
    """Send the trial's signal; what happened."""
    if process.poll() is not None:
        return {"signal": how, "finished_before": True, "returncode": process.returncode}
    processes = tree(process)
    sent = time.monotonic()
    if how == "SIGKILL":
        kill_all(processes)
        process.wait()
        return {"signal": how, "finished_before": False, "returncode": process.returncode}
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=term_wait)
        exited = True
    except subprocess.TimeoutExpired:
        exited = False
    exit_s = time.monotonic() - sent
    if not exited:
        kill_all(processes[:1])
    process.wait()
    time.sleep(0.5)  # children that outlive their parent by a moment are not orphans
    orphans = kill_all(processes[1:])
    return {
        "signal": how,
        "finished_before": False,
        "exited_on_its_own": exited,
        "exit_s": round(exit_s, 2),
        "returncode": process.returncode,
        "orphans_killed": orphans,
    }


def wait_for(anchor: str, output: str, process: subprocess.Popen, timeout: float = 600) -> bool:
    """Until the moment a kill's delay counts from: the start, the plan written (the
    fake engine's start-up is most of its run), or the first checkpoint (the real's)."""
    from nightshift.io.outputs import JobOutput

    ready = {
        "start": lambda: True,
        "plan": lambda: JobOutput(output).plans.manifest() is not None,
        "checkpoint": lambda: held(output) > 0,
    }[anchor]
    deadline = time.monotonic() + timeout
    while process.poll() is None and not ready():
        if time.monotonic() > deadline:
            return False  # hung before it got there: the kill lands now
        time.sleep(0.1)
    return True


def held(output: str) -> int:
    """Records the output holds (committed or checkpointed); 0 before a plan exists."""
    from nightshift.errors import UserError
    from nightshift.jobs.status import output_status

    try:
        records = output_status(output)["records"]
    except UserError:
        return 0
    return records["ok"] + records["failed"]
