"""The suite's xdist groups and the cores their engines use: a hook and a fixture of the
conftest's, kept in a module of their own: the check that they work
(``test_suite_groups``) imports them in three processes, without the conftest's imports
(the SDKs, the batch server: seconds each).

``make test`` runs four xdist workers (``-n 4 --dist loadgroup``); the real-engine tests
go to groups that run one test at a time each. vLLM's CPU workers bind their threads to
the cores they are given (``auto``: the same cores for every engine), so two engine
processes at once would crawl, and some of these tests kill or freeze the engine
processes they started. On a CPU host of two cores or more they make two groups
(``LANES``), a test module each in turn, and each lane's engines are bound to its half of
the cores (``VLLM_CPU_OMP_THREADS_BIND``, unless the user set it: then one lane). A lane
test holds a lock on its cores while it runs, and a test that binds engines to every
core itself (``engine_all_cores``: ``jobs run --workers``) holds them all, so it waits
for the other lane's test and that lane waits for it. A GPU host, or a single core, gets
one lane. The tests whose engine runs in the test's own process (``engine_in_process``:
vLLM binds no thread there) are a group of their own beside the lanes. The rest share
the workers, whose subprocesses often wait (on a lease, a window, a server) and leave a
core free. pytest 9.2 drops the group xdist writes into each test's id
(pytest-dev/pytest-xdist#1386), so pytest stays below it (pyproject.toml).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

LANES = ("engine", "engine_2")  # the real-engine tests' groups, each bound to its cores
IN_PROCESS = "engine_in_process"
BIND = "VLLM_CPU_OMP_THREADS_BIND"


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks it adds
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each real-engine test's group (see the module)."""
    lanes = LANES if lanes_split() else LANES[:1]
    modules: list[str] = []  # the real-engine tests' modules, in collection order
    for item in items:
        if item.get_closest_marker(IN_PROCESS):
            item.add_marker(pytest.mark.xdist_group(IN_PROCESS))
        elif item.get_closest_marker("engine"):
            module = item.nodeid.split("::")[0]
            modules += [] if module in modules else [module]
            item.add_marker(pytest.mark.xdist_group(lanes[modules.index(module) % len(lanes)]))


@pytest.fixture(autouse=True)
def engine_lane_cores(request, monkeypatch, tmp_path_factory) -> Iterator[None]:
    """A lane test's engines are bound to its lane's cores, held for the test (all of
    them for an ``engine_all_cores`` test, which binds its engines itself)."""
    cores = lane_cores(request.node)
    if cores is None:
        yield
        return
    every = request.node.get_closest_marker("engine_all_cores") is not None
    # The session's own folder, the same for every xdist worker of the session.
    locks = Path(tmp_path_factory.getbasetemp()).parent / "core-locks"
    with _held(locks, _cores() if every else [int(c) for c in cores.split(",")]):
        if not every:
            monkeypatch.setenv(BIND, cores)
        yield


def lanes_split() -> bool:
    """Two lanes: a CPU host of two cores or more whose user set no binding."""
    return len(_cores()) >= 2 and BIND not in os.environ and not _gpu_host()


def lane_cores(item: pytest.Item) -> str | None:
    """The cores the engines of ``item``'s lane are bound to (``BIND``'s form: "0" or
    "0,1"); None for a test in no lane, or where the lanes are not split."""
    group = item.get_closest_marker("xdist_group")
    if group is None or group.args[0] not in LANES or not lanes_split():
        return None
    cores = _cores()
    half = len(cores) // 2
    mine = cores[:half] if group.args[0] == LANES[0] else cores[half : 2 * half]
    return ",".join(map(str, mine))


@contextlib.contextmanager
def _held(folder: Path, cores: list[int]) -> Iterator[None]:
    """Hold a lock on each of ``cores``, taken in order (no two tests wait on each other)."""
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for core in sorted(cores):
            lock = stack.enter_context(open(folder / f"core-{core}.lock", "w"))  # noqa: SIM115
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@functools.cache
def _gpu_host() -> bool:
    from nightshift.engines.devices import given_devices

    return given_devices() is not None
