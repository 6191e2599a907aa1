"""The suite's own promise (tests/conftest.py): under ``--dist loadgroup`` the real-engine
tests run in groups, one test at a time each, on one xdist worker a group. A pytest or
xdist upgrade that drops the groups does so silently (pytest-dev/pytest-xdist#1386), and
vLLM engines then share cores: this runs the conftest's hook on eight marked tests and
checks (six with an engine process, in two modules: a lane each where the host has two
cores; two with their engine in the test's process: a group of their own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_real_engine_tests_run_in_their_groups_one_worker_each(tmp_path):
    from tests.groups import LANES

    (tmp_path / "conftest.py").write_text(
        "from tests.groups import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.engine\n\n\n"
        "@pytest.mark.parametrize('i', range(4))\ndef test_marked(i):\n    pass\n"
    )
    (tmp_path / "test_marked_too.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.engine\n\n\n"
        "@pytest.mark.parametrize('i', range(2))\ndef test_marked_too(i):\n    pass\n"
    )
    (tmp_path / "test_here.py").write_text(
        "import pytest\n\npytestmark = [pytest.mark.engine, pytest.mark.engine_in_process]\n\n\n"
        "@pytest.mark.parametrize('i', range(2))\ndef test_here(i):\n    pass\n"
    )
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    engine: the real engine\n    engine_in_process: here\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    passed = re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)", run.stdout)
    assert len(passed) == 8, run.stdout
    second = "@" + LANES[1 if lane_core_of(LANES[1]) is not None else 0]  # lanes split?
    for name, group, count in (
        ("test_marked", "@engine", 4),
        ("test_marked_too", second, 2),
        ("test_here", "@engine_in_process", 2),
    ):
        ours = [(worker, test) for worker, test in passed if f"::{name}[" in test]
        assert len(ours) == count, passed
        assert all(test.endswith(group) for _, test in ours), passed
        assert len({worker for worker, _ in ours}) == 1, passed


def lane_core_of(lane: str) -> str | None:
    """The core ``groups.lane_core`` gives a test of ``lane``."""
    import pytest

    from tests.groups import lane_core

    class Item:
        def get_closest_marker(self, name):
            return pytest.mark.xdist_group(lane).mark if name == "xdist_group" else None

    return lane_core(Item())


def test_the_two_lanes_bind_their_engines_to_two_cores():
    """Where the lanes are split, each binds its engines to a core of its own."""
    import pytest

    from tests.groups import LANES

    cores = [lane_core_of(lane) for lane in LANES]
    if cores[1] is None:
        pytest.skip("one lane here: a GPU host, or a single core")
    assert cores[0] != cores[1] and {int(c) for c in cores} <= os.sched_getaffinity(0)
