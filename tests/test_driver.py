"""`make setup`'s GPU check: the NVIDIA driver against the CUDA vLLM's torch needs."""

from __future__ import annotations

from nightshift.engines.driver import driver_problem, main


def test_a_driver_too_old_for_cuda_13_names_itself_and_the_fix():
    problem = driver_problem("550.54.15", "13.0", cuda_works=False)
    assert "NVIDIA driver 550.54.15 is too old" in problem and "R580" in problem
    assert "upgrade the driver" in problem
    assert driver_problem("580.65.06", "13.0", cuda_works=True) is None
    assert "sees no usable GPU" in driver_problem("580.65.06", "13.0", cuda_works=False)
    assert "rm -rf .venv && make setup" in driver_problem("580.65.06", None, cuda_works=False)


def test_the_check_runs_only_where_nvidia_smi_answers(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main() == 0 and capsys.readouterr() == ("", "")  # no nvidia-smi: a no-op
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 550.54.15\n")
    smi.chmod(0o755)
    assert main() == 1  # this venv's torch is the CPU build
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "550.54.15" in err and "rm -rf .venv" in err
