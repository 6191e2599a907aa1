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

An engine still starting can be killed too (a stop or a cancel abandons it): each
start registers the processes it starts (``StartingProcesses``), and the engine-core
manager of vLLM registers its cores there. Helper processes that are no engine
(Prefect's temporary server) die with this process through ``PR_SET_PDEATHSIG``,
started from a thread that lasts as long as the process (``lasting_thread_call``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The pid of the process that starts engine cores, set just before each start: a core
# whose parent pid differs from it has lost its parent (even one that died before the
# core got this far, under spawn's slow imports).
_PARENT_ENV = "NIGHTSHIFT_ENGINE_PARENT"
_POLL_S = 0.5
_unwatched: Callable[..., Any] | None = None  # vLLM's own entry point, once replaced
_untracked: Callable[..., Any] | None = None  # vLLM's CoreEngineProcManager.__init__


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


GONE_WAIT_S = 60.0  # how long a closed engine's killed processes may take to be gone


def process_tree(pids: list[int]) -> list[int]:
    """The pids of each process and all its descendants (a TP engine's workers)."""
    import psutil

    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            found += [p.pid for p in root.children(recursive=True)] + [pid]
    return found


def shared_segments(pids: list[int]) -> set[str]:
    """The /dev/shm files these processes map: vLLM's message queues between an engine
    core and its workers (about 160 MiB each), which a SIGKILL leaves behind."""
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                if path.startswith("/dev/shm/"):
                    found.add(path.removesuffix(" (deleted)"))
    return found


def wait_gone(pids: list[int], timeout_s: float = GONE_WAIT_S) -> list[int]:
    """Wait until these processes are gone (exited: a zombie holds no memory, and its
    parent, vLLM, reaps it); the pids still running after ``timeout_s``."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def remove_segments(paths: set[str]) -> None:
    """Unlink the shared-memory files a dead engine's processes mapped (no live process
    of it is left to use them; a mapping elsewhere stays valid without its name)."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


class EngineProcesses:
    """An engine's killed processes and the shared memory they mapped: its ``close``
    waits until they are gone, so the next engine finds the GPU free, then unlinks the
    segments a SIGKILL left in /dev/shm."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.segments: set[str] = set()

    def kill(self, roots: list[int]) -> None:
        tree = process_tree(roots)
        self.segments |= shared_segments(tree)  # read before they die: /proc goes with them
        self.pids |= set(tree)
        kill_process_tree(tree)

    def wait_and_clean(self, timeout_s: float = GONE_WAIT_S) -> None:
        """Once every killed process is gone, remove its segments; EngineError naming a
        process that is still there after ``timeout_s`` (its GPU memory is not free)."""
        from nightshift.errors import EngineError

        left = wait_gone(sorted(self.pids), timeout_s)
        if left:
            raise EngineError(
                f"engine process {left[0]} still runs {timeout_s:g} s after SIGKILL (stuck "
                "in the GPU driver?), so its GPU memory is not free: end it, or reset the "
                "GPU, before the next run"
            )
        remove_segments(self.segments)
        self.pids.clear()
        self.segments.clear()


def engine_cores_die_with_this_process() -> None:
    """Make every vLLM engine core this process starts from now on die with it."""
    global _unwatched, _untracked
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.engine.utils import CoreEngineProcManager

    os.environ[_PARENT_ENV] = str(os.getpid())
    if _unwatched is None:
        _unwatched = EngineCoreProc.run_engine_core
        EngineCoreProc.run_engine_core = staticmethod(_run_engine_core)
    if _untracked is None:
        _untracked = CoreEngineProcManager.__init__
        CoreEngineProcManager.__init__ = _tracked_manager_init


def _tracked_manager_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """vLLM's engine-core process manager, its processes registered with the engine start
    of this thread as they start (``StartingProcesses``): a start-up can be killed."""
    starting = register_starting(
        lambda: [p.pid for p in getattr(self, "processes", None) or [] if p.pid]
    )
    assert _untracked is not None
    _untracked(self, *args, **kwargs)
    if starting is not None:
        starting.recheck()  # a core started after a kill: killed now, before the handshake


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


class StartingProcesses:
    """The processes one engine start (in one thread) has started so far, so another
    thread can kill a start-up that is still under way (a stop, a cancel): the start
    then fails (vLLM sees its core die during the handshake) instead of running on for
    minutes. A process registered after the kill is killed as it registers."""

    def __init__(self) -> None:
        self.killed = False
        self._sources: list[Callable[[], list[int]]] = []
        self._lock = threading.Lock()

    def add(self, pids: Callable[[], list[int]]) -> None:
        with self._lock:
            self._sources.append(pids)
            killed = self.killed
        if killed:
            kill_process_tree(pids())

    def recheck(self) -> None:
        """Kill again what is registered if the start was killed meanwhile (processes
        a registered source started after the kill)."""
        if self.killed:
            self.kill()

    def kill(self) -> None:
        with self._lock:
            self.killed = True
            sources = list(self._sources)
        for pids in sources:
            with contextlib.suppress(Exception):
                kill_process_tree(pids())


_starting = threading.local()


@contextlib.contextmanager
def engine_start_processes(starting: StartingProcesses) -> Iterator[StartingProcesses]:
    """Within the block, engine processes this thread starts register in ``starting``."""
    previous = getattr(_starting, "current", None)
    _starting.current = starting
    try:
        yield starting
    finally:
        _starting.current = previous


def register_starting(pids: Callable[[], list[int]]) -> StartingProcesses | None:
    """Register processes an engine start in this thread began (``pids`` lists them as
    they are now); returns the start's registry, None outside a tracked start."""
    starting = getattr(_starting, "current", None)
    if starting is not None:
        starting.add(pids)
    return starting


def start_was_killed() -> bool:
    """Whether the engine start running in this thread was killed (no fallback then)."""
    starting = getattr(_starting, "current", None)
    return bool(starting is not None and starting.killed)


def kill_children() -> None:
    """SIGKILL every process this one started, and theirs (the process is about to end
    with ``os._exit``: nothing it started may outlive it)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        kill_process_tree([c.pid for c in psutil.Process().children()])


def die_with_this_process() -> Callable[[], None]:
    """A ``preexec_fn`` for a helper process (Prefect's temporary server): it gets
    SIGKILL when this process dies, however it dies (``PR_SET_PDEATHSIG``). The signal
    follows the *thread* that forks, so start it from ``lasting_thread_call``."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return preexec


_PR_SET_PDEATHSIG = 1
_calls: queue.Queue | None = None
_calls_lock = threading.Lock()


def lasting_thread_call(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread that lives as long as this process and return its result:
    a child it starts with ``die_with_this_process`` dies with the process, not with the
    (short-lived) thread that asked for it."""
    global _calls
    with _calls_lock:
        if _calls is None:
            _calls = queue.Queue()
            threading.Thread(target=_serve_calls, args=(_calls,), daemon=True).start()
    done: queue.Queue = queue.Queue(maxsize=1)
    _calls.put((fn, done))
    ok, value = done.get()
    if not ok:
        raise value
    return value


def _serve_calls(calls: queue.Queue) -> None:
    threading.current_thread().name = "nightshift-spawner"
    while True:
        fn, done = calls.get()
        try:
            done.put((True, fn()))
        except BaseException as exc:  # handed back to the caller's thread
            done.put((False, exc))
