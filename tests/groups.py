"""The suite's xdist groups, a hook of the conftest's kept in a module of its own: the
check that it works (``test_suite_groups``) imports it in three processes, without the
conftest's imports (the SDKs, the batch server: seconds each)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks it adds
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``make test`` runs three xdist workers (``-n 3 --dist loadgroup``); the real-engine
    tests all go to one of them, one at a time: vLLM's CPU workers bind their threads to
    the same core, so two engine processes at once would crawl, and some of these tests
    kill or freeze the engine processes they started. The tests whose engine runs in the
    test's own process (``engine_in_process``: no engine process, threads unbound) are a
    second group, one at a time beside the first. The others share the workers, whose
    subprocesses often wait (on a lease, a window, a server) and leave a core free.
    pytest 9.2 drops the group xdist writes into each test's id
    (pytest-dev/pytest-xdist#1386), so pytest stays below it (pyproject.toml)."""
    for item in items:
        if item.get_closest_marker("engine_in_process"):
            item.add_marker(pytest.mark.xdist_group("engine_in_process"))
        elif item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.xdist_group("engine"))
