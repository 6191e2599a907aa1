"""The suite's xdist groups, a hook of the conftest's kept in a module of its own: the
check that it works (``test_suite_groups``) imports it in three processes, without the
conftest's imports (the SDKs, the batch server: seconds each)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks it adds
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``make test`` runs three xdist workers (``-n 3 --dist loadgroup``); the real-engine
    tests all go to one of them, one at a time: two vLLM engines on two cores would each
    run at half speed, and some of these tests kill or freeze the engine processes they
    started. The others share the other workers, whose subprocesses often wait (on a
    lease, a window, a server) and leave a core to the third. pytest 9.2 drops the
    group xdist writes into each test's id (pytest-dev/pytest-xdist#1386), so pytest
    stays below it (pyproject.toml)."""
    for item in items:
        if item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.xdist_group("engine"))
