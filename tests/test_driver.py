"""`make setup`'s GPU check: the NVIDIA driver against the CUDA vLLM's torch needs."""

from __future__ import annotations

import os
import subprocess
import sys

from nightshift.engines.driver import driver_problem


def test_a_driver_too_old_for_cuda_13_names_itself_and_the_fix():
    problem = driver_problem("550.54.15", "13.0", cuda_works=False)
    assert "NVIDIA driver 550.54.15 is too old" in problem and "R580" in problem
    assert "upgrade the driver" in problem
    assert driver_problem("580.65.06", "13.0", cuda_works=True) is None
    assert "sees no usable GPU" in driver_problem("580.65.06", "13.0", cuda_works=False)
    assert "rm -rf .venv && make setup" in driver_problem("580.65.06", None, cuda_works=False)


def test_the_check_runs_only_where_nvidia_smi_answers(tmp_path):
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    check = [sys.executable, "-m", "nightshift.engines.driver"]
    quiet = subprocess.run(check, env=env, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and not quiet.stdout + quiet.stderr  # no nvidia-smi: no-op
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 550.54.15\n")
    smi.chmod(0o755)
    done = subprocess.run(check, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1  # this venv's torch is the CPU build
    assert done.stderr.count("\n") == 1 and "550.54.15" in done.stderr
