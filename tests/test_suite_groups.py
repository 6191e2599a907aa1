"""The suite's own promise (tests/groups.py): under ``--dist loadgroup`` the real-engine
tests run in groups, one test at a time each, on one xdist worker a group, and each lane's
engines are bound to cores of their own. A pytest or xdist upgrade that drops the groups
does so silently (pytest-dev/pytest-xdist#1386), and vLLM engines then share cores: this
runs the conftest's hook and fixture on eight marked tests and checks (six with an engine
process, in two modules: a lane each where the host has two cores; two with their engine
in the test's process: a group of their own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from nightshift.engines.devices import given_devices

ROOT = Path(__file__).resolve().parents[1]
BIND = "VLLM_CPU_OMP_THREADS_BIND"


def _marked(name: str, count: int, marks: str) -> str:
    """A test module of ``count`` tests under ``marks``, each writing down the binding
    its engines would get."""
    return (
        f"import os\nimport pytest\n\npytestmark = {marks}\n\n\n"
        f"@pytest.mark.parametrize('i', range({count}))\ndef {name}(i):\n"
        f"    print('BIND', os.environ.get('{BIND}'))\n"
    )


def test_real_engine_tests_run_in_their_groups_one_worker_each(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "from tests.groups import engine_lane_cores, pytest_collection_modifyitems  # noqa\n"
    )
    (tmp_path / "test_marked.py").write_text(_marked("test_marked", 4, "pytest.mark.engine"))
    (tmp_path / "test_marked_too.py").write_text(
        _marked("test_marked_too", 2, "pytest.mark.engine")
    )
    (tmp_path / "test_here.py").write_text(
        _marked("test_here", 2, "[pytest.mark.engine, pytest.mark.engine_in_process]")
    )
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    engine: the real engine\n    engine_in_process: here\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-rP",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    passed = re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)", run.stdout)
    assert len(passed) == 8, run.stdout
    cores = sorted(os.sched_getaffinity(0))
    split = len(cores) >= 2 and BIND not in os.environ and given_devices() is None
    half = len(cores) // 2
    lanes = {  # each module's group, and the binding its tests see
        "test_marked": ("@engine", ",".join(map(str, cores[:half])) if split else None),
        "test_marked_too": (
            "@engine_2" if split else "@engine",
            ",".join(map(str, cores[half : 2 * half])) if split else None,
        ),
        "test_here": ("@engine_in_process", None),
    }
    for name, (group, bind) in lanes.items():
        ours = [(worker, test) for worker, test in passed if f"::{name}[" in test]
        assert len(ours) == (4 if name == "test_marked" else 2), passed
        assert all(test.endswith(group) for _, test in ours), passed
        assert len({worker for worker, _ in ours}) == 1, passed
        seen = re.findall(
            rf"_+ {name}\[\d\] _+\n(?:\[gw\d+\].*\n)?-+ Captured stdout call -+\nBIND (\S+)",
            run.stdout,
        )
        assert seen == [str(bind)] * len(ours), run.stdout
    if split:  # the two lanes' cores are apart
        assert not set(lanes["test_marked"][1].split(",")) & set(
            lanes["test_marked_too"][1].split(",")
        )


def test_a_test_that_binds_every_core_waits_for_the_lane_holding_one(tmp_path):
    """``engine_all_cores`` (``jobs run --workers``): its locks wait for the other lane's
    test to end, and that lane's next test waits for it."""
    from tests.groups import _held

    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def lane() -> None:
        with _held(tmp_path, [0]):
            order.append("lane in")
            inside.set()
            release.wait(10)
            order.append("lane out")

    def every() -> None:
        with _held(tmp_path, [0, 1]):
            order.append("all in")

    first = threading.Thread(target=lane)
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=every)
    second.start()
    time.sleep(0.3)
    assert order == ["lane in"]  # still waiting for core 0
    release.set()
    first.join(10)
    second.join(10)
    assert order == ["lane in", "lane out", "all in"]
