"""The suite's xdist groups, a hook of the conftest's kept in a module of its own: the
check that it works (``test_suite_groups``) imports it in three processes, without the
conftest's imports (the SDKs, the batch server: seconds each)."""

from __future__ import annotations

import functools
import os

import pytest

LANES = ("engine", "engine_2")  # the real-engine tests' groups, each bound to a core
IN_PROCESS = "engine_in_process"


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks it adds
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``make test`` runs four xdist workers (``-n 4 --dist loadgroup``); the real-engine
    tests go to groups that run one test at a time each. vLLM's CPU workers bind their
    threads to the cores they are given (``auto``: the same core for every engine), so
    two engine processes at once would crawl, and some of these tests kill or freeze
    the engine processes they started. On a CPU host of two cores or more they make two
    groups (``LANES``), a test module each in turn, whose engines are bound to a core
    each (``lane_core``, which the conftest sets); a GPU host, or a single core, gets
    one. The tests whose engine runs in the test's own process (``engine_in_process``:
    no engine process, threads unbound) are a group of their own, one at a time beside
    the others. The rest share the workers, whose subprocesses often wait (on a lease,
    a window, a server) and leave a core free. pytest 9.2 drops the group xdist writes
    into each test's id (pytest-dev/pytest-xdist#1386), so pytest stays below it
    (pyproject.toml)."""
    lanes = LANES if len(_cores()) >= 2 and not _gpu_host() else LANES[:1]
    modules: list[str] = []  # the real-engine tests' modules, in collection order
    for item in items:
        if item.get_closest_marker(IN_PROCESS):
            item.add_marker(pytest.mark.xdist_group(IN_PROCESS))
        elif item.get_closest_marker("engine"):
            module = item.nodeid.split("::")[0]
            modules += [] if module in modules else [module]
            item.add_marker(pytest.mark.xdist_group(lanes[modules.index(module) % len(lanes)]))


def lane_core(item: pytest.Item) -> str | None:
    """The core the engines of ``item``'s lane are bound to (``VLLM_CPU_OMP_THREADS_BIND``);
    None for a test in no lane, or where the lanes are not split."""
    group = item.get_closest_marker("xdist_group")
    cores = _cores()
    if group is None or group.args[0] not in LANES or len(cores) < 2 or _gpu_host():
        return None
    return str(cores[LANES.index(group.args[0])])


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@functools.cache
def _gpu_host() -> bool:
    from nightshift.engines.devices import given_devices

    return given_devices() is not None
