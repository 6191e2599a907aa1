"""A closed engine's processes are gone before the next engine starts, and the shared
memory a SIGKILL leaves in /dev/shm is removed (vLLM's TP message queues)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from nightshift.engines import processes
from nightshift.engines.processes import EngineProcesses
from nightshift.errors import EngineError

# An "engine core" that maps a /dev/shm segment and starts a "worker" child mapping it too.
CORE = """
import mmap, os, subprocess, sys, time
path = sys.argv[1]
with open(path, "wb") as f:
    f.truncate(4096)
f = open(path, "r+b"); m = mmap.mmap(f.fileno(), 4096)
code = "import mmap,sys,time; f=open(sys.argv[1],'r+b'); m=mmap.mmap(f.fileno(),4096); " \
    "time.sleep(600)"
subprocess.Popen([sys.executable, "-c", code, path])
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_killed_engine_is_waited_for_and_its_shared_memory_removed():
    segment = Path(f"/dev/shm/nightshift-test-{uuid.uuid4().hex[:8]}")
    core = subprocess.Popen([sys.executable, "-c", CORE, str(segment)], stdout=subprocess.PIPE)
    try:
        assert core.stdout.readline().strip() == b"ready"
        time.sleep(0.5)  # the worker maps the segment too
        tree = [core.pid, *(c.pid for c in psutil.Process(core.pid).children())]
        assert len(tree) == 2
        ended = EngineProcesses()
        ended.kill([core.pid])
        assert str(segment) in ended.segments
        ended.wait_and_clean(timeout_s=20)
        for pid in tree:  # gone (a zombie awaiting its parent's reaping is gone too)
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert not segment.exists()
    finally:
        core.kill()
        core.wait()
        segment.unlink(missing_ok=True)


def test_a_process_that_outlives_the_wait_is_a_one_line_error_naming_it(monkeypatch):
    monkeypatch.setattr(processes, "wait_gone", lambda pids, timeout_s: [4242])
    ended = EngineProcesses()
    ended.pids, ended.segments = {4242}, {"/dev/shm/psm_keep"}
    with pytest.raises(EngineError) as error:
        ended.wait_and_clean(timeout_s=5)
    assert "engine process 4242 still runs 5 s after SIGKILL" in str(error.value)
    assert "\n" not in str(error.value)
    assert ended.segments  # nothing removed while a process may still use it
