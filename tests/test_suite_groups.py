"""The suite's own promise (tests/conftest.py): under ``--dist loadgroup`` every
real-engine test runs on one xdist worker, in turn. A pytest or xdist upgrade that drops
the group does so silently (pytest-dev/pytest-xdist#1386), and two vLLM engines then
share two cores: this runs the conftest's hook on six marked tests and checks (four with
an engine process, two with their engine in the test's process: a group of their own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_real_engine_tests_all_run_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "from tests.groups import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.engine\n\n\n"
        "@pytest.mark.parametrize('i', range(4))\ndef test_marked(i):\n    pass\n"
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
    assert len(passed) == 6, run.stdout
    for name, group in (("test_marked", "@engine"), ("test_here", "@engine_in_process")):
        ours = [(worker, test) for worker, test in passed if f"::{name}[" in test]
        assert len(ours) == (4 if name == "test_marked" else 2), passed
        assert all(test.endswith(group) for _, test in ours), passed
        assert len({worker for worker, _ in ours}) == 1, passed
