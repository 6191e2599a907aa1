"""Placement on a simulated GPU host: the devices given (CUDA_VISIBLE_DEVICES as ids,
UUIDs or MIG ids, else a stub ``nvidia-smi``), one host-wide lock per device, and the
``placement`` every report carries. The fake engine goes through the same code."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from nightshift.engines.devices import (
    DeviceError,
    given_devices,
    hold_devices,
    visible_devices,
)
from nightshift.jobs.spec import JobSpec
from nightshift.pipelines.launch import check_workers, device_env
from nightshift.running.placement import start_placed

from .conftest import spec_dict
from .durable import report
from .test_workers import tickets, write_records

GPUS = ["GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-1111", "GPU-cccccccc-2222"]
SMI = """#!/bin/sh
echo "GPU 0: NVIDIA H200 (UUID: GPU-aaaaaaaa-0000)"
echo "GPU 1: NVIDIA H200 (UUID: GPU-bbbbbbbb-1111)"
echo "  MIG 3g.71gb     Device  0: (UUID: MIG-1111-a)"
echo "  MIG 3g.71gb     Device  1: (UUID: MIG-1111-b)"
"""


@pytest.fixture
def locks(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "locks"
    monkeypatch.setenv("NIGHTSHIFT_DEVICE_LOCKS", str(folder))
    return folder


@pytest.fixture
def smi(tmp_path, monkeypatch) -> Path:
    """A stub nvidia-smi on PATH: two H200s, the second split into two MIG instances."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return bin_dir


def test_devices_given_by_the_variable_win_over_the_driver(smi, monkeypatch):
    assert given_devices() == ["GPU-aaaaaaaa-0000", "MIG-1111-a", "MIG-1111-b"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 5,MIG-x")
    assert given_devices() == ["4", "5", "MIG-x"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,-1,4")  # CUDA ignores what follows -1
    assert given_devices() == ["3"]
    for none in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", none)
        assert given_devices() is None


def test_no_gpu_given_no_placement(monkeypatch, tmp_path, locks):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert given_devices() is None
    engine = start_placed(1, lambda: _Engine())
    assert getattr(engine, "placement", None) is None
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_engines_hold_distinct_devices_until_closed(locks, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(GPUS[:2]))
    seen = []
    first = start_placed(1, lambda: _Engine(seen))
    second = start_placed(1, lambda: _Engine(seen))
    assert seen == [GPUS[0], GPUS[1]]  # each started with its own device visible
    assert {first.placement, second.placement} == set(GPUS[:2])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(GPUS[:2])  # the process's own back
    with pytest.raises(InterruptedError):  # both held: a third waits (here: gives up)
        hold_devices(1, GPUS[:2], abandoned=lambda: True)
    first.close()
    third = start_placed(1, lambda: _Engine(seen))
    assert third.placement == first.placement
    assert not second.closed


def test_an_index_and_its_uuid_are_one_device(smi, locks, monkeypatch):
    by_uuid = hold_devices(1, ["GPU-aaaaaaaa-0000"])
    with pytest.raises(InterruptedError):
        hold_devices(1, ["0"], abandoned=lambda: True)  # nvidia-smi's GPU 0
    by_uuid.release()
    assert hold_devices(1, ["0"]).devices == ("0",)


def test_a_waiting_engine_starts_once_a_device_is_free(locks):
    held = hold_devices(1, GPUS[:1])
    got = []
    waiter = threading.Thread(target=lambda: got.append(hold_devices(1, GPUS[:1])))
    waiter.start()
    time.sleep(1.5)
    assert not got
    held.release()
    waiter.join(10)
    assert got and got[0].devices == (GPUS[0],)


def test_tensor_parallel_engine_takes_its_devices_together(locks):
    held = hold_devices(2, GPUS)
    assert held.visible == f"{GPUS[0]},{GPUS[1]}"
    with pytest.raises(DeviceError, match="engine.tensor_parallel_size 4 needs 4 GPU"):
        hold_devices(4, GPUS)
    with visible_devices(held):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == held.visible


def test_more_workers_than_devices_refused_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(GPUS[:2]))
    spec = JobSpec.model_validate(spec_dict(tmp_path, tmp_path, tmp_path / "out"))
    with pytest.raises(DeviceError) as refused:
        check_workers(spec, 3)
    assert "\n" not in str(refused.value)
    assert "--workers 3 x engine.tensor_parallel_size 1 needs 3 GPU(s)" in str(refused.value)
    check_workers(spec, 2)
    assert device_env(spec, 1, 2) == {"CUDA_VISIBLE_DEVICES": ",".join(GPUS[:2])}


def test_cli_refuses_more_workers_than_gpus(tmp_path, write_spec, models, monkeypatch):
    from typer.testing import CliRunner

    from nightshift.cli import app

    data = write_records(tmp_path / "in.parquet", tickets(4))
    spec = write_spec(spec_dict(models["chat"], data, tmp_path / "out", run={"engine": "fake"}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(GPUS[:2]))
    done = CliRunner().invoke(app, ["jobs", "run", str(spec), "--workers", "3"])
    assert done.exit_code == 2, done.output
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs 3 GPU(s) but this host gives 2" in lines[0]
    assert not (tmp_path / "out").exists()  # refused before anything started


def test_concurrent_jobs_and_workers_on_distinct_devices(tmp_path, locks, models):
    """Three engines up at once on a 3-GPU host given by UUID: a one-worker job and a
    two-worker job, each with its own temporary state; every engine holds its own GPU
    while all of them start (the fake engine's start lasts while ``hold`` exists)."""
    hold = tmp_path / "hold"
    hold.write_text("")
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(GPUS),
        "NIGHTSHIFT_FAKE_START_HOLD": str(hold),
        "NIGHTSHIFT_DEVICE_LOCKS": str(locks),
        "NIGHTSHIFT_GPU_LIMIT": f"test-gpus-{uuid.uuid4().hex[:8]}",
    }
    runs = {}
    for name, workers in (("single", 1), ("pair", 2)):
        data = write_records(tmp_path / name / "in.parquet", tickets(40))
        out = tmp_path / name / "out"
        spec = spec_dict(
            models["chat"], data, out, plan={"shard_records": 10}, run={"engine": "fake"}
        )
        path = tmp_path / name / "job.yaml"
        path.write_text(yaml.safe_dump(spec))
        runs[name] = _start_job(path, workers, env)
    try:
        _wait_until_held(locks, len(GPUS), runs)
    finally:
        hold.unlink()
    for run in runs.values():
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    single = report(str(tmp_path / "single" / "out"))["placement"]["engines"]
    pair = report(str(tmp_path / "pair" / "out"))["placement"]["engines"]
    assert len(single) == 1 and len(pair) == 2
    devices = [e["cuda_visible_devices"] for e in single + pair]
    assert sorted(devices) == sorted(GPUS)  # three engines, three GPUs, none shared
    assert len({e["worker"] for e in pair}) == 2


def _start_job(path: Path, workers: int, env: dict) -> subprocess.Popen:
    command = [sys.executable, "-m", "nightshift.cli", "jobs", "run", str(path), "-q"]
    return subprocess.Popen(
        [*command, "--workers", str(workers)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_until_held(folder: Path, count: int, runs: dict, timeout: float = 240) -> None:
    """Until ``count`` device locks in ``folder`` are held by the runs' engines."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(_is_held(f) for f in folder.glob("*.lock")) == count:
            return
        for run in runs.values():
            assert run.poll() is None, run.communicate()[1]
        time.sleep(0.2)
    raise AssertionError(f"{count} devices never held at once: {list(folder.glob('*'))}")


def _is_held(lock: Path) -> bool:
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


class _Engine:
    """Notes the CUDA_VISIBLE_DEVICES it started under."""

    def __init__(self, seen: list | None = None) -> None:
        if seen is not None:
            seen.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_the_planner_asks_the_same_question_and_plans_for_the_target(monkeypatch, tmp_path):
    """One answer to "is there a GPU" (C4 of the review): the planner's block size follows
    the devices the host gives; plan.block_size plans for another machine's engine."""
    from nightshift.scheduling.kvcache import block_size, has_gpu

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    data = spec_dict(tmp_path, tmp_path, tmp_path / "out")
    data["engine"] = {}
    spec = JobSpec.model_validate(data)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", GPUS[0])
    assert has_gpu() and block_size(spec) == 16
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not has_gpu() and block_size(spec) == 128
    data["plan"] = {"block_size": 16}  # a CPU box planning for GPU workers
    assert block_size(JobSpec.model_validate(data)) == 16
