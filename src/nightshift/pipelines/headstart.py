"""What a run started from this process does before its flow exists: the head start.

Before the job flow's first line runs, Prefect boots its temporary server (a process
of its own, about 5 s) and the flow run is created; then the flow imports vLLM (about
7 s) as it starts the engine. None of these needs the others, so ``head_start``:

1. boots the temporary server in the background (when no ``PREFECT_API_URL`` is set);
2. meanwhile imports vLLM, the flow and the tokenizer's package (transformers, which
   imports torch: 3 s on the fake engine, where vLLM does not import it first) here, in
   the main thread (imports are not run in two threads at once: two threads importing
   modules that import each other can deadlock);
3. starts the engine itself (``running.engines.start_head``), where this host holds
   no GPU slot: a GPU host's engine waits for its slot, which needs the server, and
   the flow starts it early once the slot is held (``pipelines.flow``).

The flow's pool takes the head-started engine over (``EnginePool.start_early``), and
the run's clock starts here (``runclock.clock_start``), so the report counts this time too.
A job with nothing left to run, one run by ``--workers``, or one with
``run.overlap_startup: false`` gets no head start; an engine no run took is shut down
when the block ends (the plan failed first).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import subprocess
import threading
import types
from collections.abc import Iterator
from importlib import import_module
from typing import Any

from nightshift.engines import processes
from nightshift.jobs.spec import JobSpec
from nightshift.pipelines.runclock import start_clock, stop_clock
from nightshift.pipelines.slots import host_takes_slots
from nightshift.running import engines
from nightshift.running.canary import canary_pending
from nightshift.running.runner import work_may_be_left


@contextlib.contextmanager
def head_start(spec: JobSpec, *, overwrite: bool, new_run: bool, workers: int) -> Iterator[None]:
    """Within the block (the flow call), the run has a head start; see the module."""
    start_clock()
    try:
        server = _boot_temporary_server()
        early = workers == 1 and spec.run.overlap_startup
        early = early and work_may_be_left(spec, overwrite, new_run) and _prepared(spec)
        early = early and not canary_pending(spec, overwrite, new_run)  # engines in turn
        import_module("nightshift.pipelines.flow")  # before the engine's thread: one importer
        _import_tokenizers()
        if early and not host_takes_slots():
            engines.start_head(spec)
        if server is not None:
            server.join()  # the flow's client must not find a half-started server
        yield
    finally:
        stop_clock()
        engines.drop_head()


def _import_tokenizers() -> None:
    """What loading the job's tokenizer imports (``engines.tokenizer``), while the server
    boots rather than after it: a plan, or a resume's first record, waits on it."""
    with contextlib.suppress(Exception):  # a broken install: the plan's own load says so
        import_module("transformers").AutoTokenizer  # noqa: B018  (a lazy module's import)


def _prepared(spec: JobSpec) -> bool:
    """Import the engine's package and check its settings; False if they are wrong."""
    try:
        engines.prepare_engine(spec)
    except Exception:  # the flow raises it, where the run's other errors go
        return False
    return True


def _stop_soon(server: Any) -> None:
    """Stop the temporary server at exit with 1 s of grace. Prefect's own stop waits
    5 s for it, then kills it: a SIGTERMed uvicorn waits for open connections, and
    this process's Prefect clients hold theirs open to the end, so the wait ran out
    after every run (5 s between the summary and the prompt)."""
    process = server.server_process
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=1)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _boot_temporary_server() -> threading.Thread | None:
    """Start Prefect's temporary server in a thread that waits for it to answer; None
    when the run reports to a server of the user's (or Prefect may not start one)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return None
    server = _own_session_server()
    if server.running:
        return None

    def boot() -> None:
        with contextlib.suppress(Exception):  # the flow's client starts it and raises
            server.start()
            atexit.register(_stop_soon, server)  # after Prefect's own stop: runs first

    thread = threading.Thread(target=boot, name="nightshift-prefect-boot", daemon=True)
    thread.start()
    return thread


def _own_session_server() -> Any:
    """Prefect's temporary server (the one every Prefect client of this process finds:
    Prefect keeps one instance per port), started so that it neither dies before
    nightshift nor outlives it:

    - in a session of its own: a terminal's Ctrl-C goes to nightshift's process group,
      and the graceful stop still has the server to end the flow run with;
    - with ``PR_SET_PDEATHSIG`` (``engines.processes.die_with_this_process``), from a
      thread that lasts as long as this process: it dies with nightshift however that
      ends, ``kill -9`` included, so no server holds its port and memory afterwards.
    """
    return _server_class()()


@functools.cache
def _server_class() -> type:
    from prefect.server.api import server as prefect_server

    class OwnSessionServer(prefect_server.SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            start = super()._run_uvicorn_command
            return processes.lasting_thread_call(lambda: _in_own_session(prefect_server, start))

    return OwnSessionServer


def _in_own_session(module: Any, start: Any) -> subprocess.Popen:
    """Call ``start`` (Prefect's own Popen of its server) with ``module``'s
    ``subprocess.Popen`` starting a new session that dies with this process."""
    popen = functools.partial(
        subprocess.Popen,
        start_new_session=True,
        preexec_fn=processes.die_with_this_process(),  # one prctl call: safe after fork
    )
    module.subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": popen})
    try:
        return start()
    finally:
        module.subprocess = subprocess
