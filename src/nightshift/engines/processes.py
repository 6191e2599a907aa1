"""vLLM's engine processes: killing a process tree, and an engine core that dies with
the process that started it.

vLLM watches its engine core from the front end (a dead core raises EngineDeadError),
and the core's tensor-parallel workers watch the core (a death pipe), but nothing in the
core watches the front end: a nightshift CLI killed alone (the OOM killer, ``kill -9``)
leaves ``VLLM::EngineCore`` running for ever, with its workers and the accelerator
memory they hold, and the rerun starts a second engine beside it. ``PR_SET_PDEATHSIG``
cannot close the gap: it fires when the *thread* that started the child exits, and
nightshift starts engines in a thread (``running.engines.EnginePool``). So each engine
core runs under ``_run_engine_core``, which first starts a thread that polls the core's
parent; once the parent is gone it SIGKILLs the core's own tree. The wrapper is a
module-level function, so it reaches the core under both fork and spawn.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

# The pid of the process that starts engine cores, set just before each start: a core
# whose parent pid differs from it has lost its parent (even one that died before the
# core got this far, under spawn's slow imports).
_PARENT_ENV = "NIGHTSHIFT_ENGINE_PARENT"
_POLL_S = 0.5
_unwatched: Callable[..., Any] | None = None  # vLLM's own entry point, once replaced


def kill_process_tree(pids: list[int]) -> None:
    """SIGKILL each process and all its descendants (children first: none is left
    orphaned). A SIGSTOPped process dies too."""
    import psutil

    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [*root.children(recursive=True), root]
        except psutil.NoSuchProcess:
            continue
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def engine_cores_die_with_this_process() -> None:
    """Make every vLLM engine core this process starts from now on die with it."""
    global _unwatched
    from vllm.v1.engine.core import EngineCoreProc

    os.environ[_PARENT_ENV] = str(os.getpid())
    if _unwatched is None:
        _unwatched = EngineCoreProc.run_engine_core
        EngineCoreProc.run_engine_core = staticmethod(_run_engine_core)


def _run_engine_core(*args: Any, **kwargs: Any) -> Any:
    """vLLM's engine-core entry point (the child's target), watched."""
    from vllm.v1.engine.core import EngineCoreProc

    _watch_parent(int(os.environ.get(_PARENT_ENV) or os.getppid()))
    # Under fork this process inherited the replaced class; under spawn it is vLLM's.
    return (_unwatched or EngineCoreProc.run_engine_core)(*args, **kwargs)


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_POLL_S)
        kill_process_tree([os.getpid()])

    threading.Thread(target=watch, name="nightshift-parent-watch", daemon=True).start()
