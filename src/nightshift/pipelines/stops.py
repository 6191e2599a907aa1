"""Graceful stops: SIGTERM, a first Ctrl-C (SIGINT), or a Prefect cancellation.

A stop stops feeding, checkpoints every answer held, releases leases, shuts the engine
down (one still starting is abandoned: killed) and writes the report marked as stopped;
``nightshift jobs run`` then exits with ``STOPPED_EXIT`` (3). Requests in flight are
aborted and are no answers. A second signal exits at once (128 + its number, as a
shell reports a killed process). A stop still unfinished after ``run.stop_s`` (its
engine is killed at 3/4 of it, so a hung step cannot hold the stop up) ends the
process only where the caller asked for it (``exit_on_overrun``: a CLI whose whole life
is this one job). Inside ``nightshift batch serve`` the overrun abandons the job
instead: its engine is killed, the flow run ends when it can, and the server goes on.

The stop does not depend on Prefect's API: Prefect's temporary server runs in a session
of its own (a terminal's Ctrl-C does not reach it; ``pipelines.headstart``), but under
systemd it gets the same SIGTERM. Once the report is written, a CLI run whose Prefect
API is gone exits with code 3 at once instead of waiting on Prefect's retries.

Before and after the flow body (the head start, the summary) the process's own handlers
(``install_process_handlers``, installed as the command starts) end the command with
exit code 3, and every process it started with it.

Prefect's flow engine replaces the SIGTERM handler for the flow run's duration
(``prefect.utilities.engine.capture_sigterm``): it raises ``TerminationSignal`` in the
main thread, which would crash the flow run while the feeding thread, and the engine,
go on. So the handlers are installed inside the flow body, over Prefect's, and put back
when it ends. A process worker's cancellation then reaches us as its SIGTERM (Prefect
cannot acknowledge its control intent without its own handler, so it sends SIGTERM and
SIGKILLs 30 s later). An in-process flow run (``jobs run``) gets no signal when it is
cancelled: a thread polls the flow run's state and stops it when it is CANCELLING.
Either way the flow run ends Cancelled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from nightshift.pipelines import tempserver

log = logging.getLogger(__name__)
STOPPED_EXIT = 3  # exit code of a run stopped gracefully: rerun the command to finish
CANCEL_POLL_S = 2.0
_API_CHECK_S = 1.0  # how often a stop waiting on Prefect checks that its API is there
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_last: GracefulStop | None = None
_exit_on_overrun = False  # what a flow body's stop does past run.stop_s (``overrun_exits``)
_raising = False  # a signal outside a flow body raises SignalStop (``raising_signals``)


class SignalStop(SystemExit):
    """SIGTERM or SIGINT outside a flow body, within ``raising_signals``: the command
    ends (exit code 3, or what its caller makes of it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(STOPPED_EXIT)
        self.signum = signum


class GracefulStop:
    """One flow run's stop: requested once (by a signal or a cancellation); ``on_stop``
    hooks run in a thread of their own, never in the signal handler."""

    def __init__(self, stop_s: float, exit_on_overrun: bool = False) -> None:
        self.stop_s = stop_s
        self.exit_on_overrun = exit_on_overrun
        self.requested = threading.Event()
        self.finished = threading.Event()  # the flow body is done: no deadline any more
        self.returned = threading.Event()  # the flow call is done, Prefect's calls too
        self.abandoned = False  # past run.stop_s in a process that must not exit
        self.has_signals = False  # its handlers took the process's signals (main thread)
        self.why: str | None = None  # "SIGTERM", "SIGINT" or "cancelled"
        self.at: float | None = None  # time.perf_counter() of the request
        self.report: dict[str, Any] | None = None  # what the stopped run returns
        self._on_stop: list[Callable[[], None]] = []
        self._on_kill: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @property
    def signum(self) -> int:
        return signal.SIGINT if self.why == "SIGINT" else signal.SIGTERM

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` on a stop (at once if one was requested already)."""
        with self._lock:
            self._on_stop.append(hook)
            late = self.requested.is_set()
        if late:
            _quietly(hook)

    def on_kill(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the stop must end now (a second signal, run.stop_s)."""
        with self._lock:
            self._on_kill.append(hook)

    def request(self, why: str) -> None:
        with self._lock:
            if self.requested.is_set():
                return
            self.why, self.at = why, time.perf_counter()
            self.requested.set()
        threading.Thread(target=self._stopping, name="nightshift-stop", daemon=True).start()

    def describe(self, run_started: float) -> dict[str, Any]:
        """``report["stopped"]``: what stopped the run and when (seconds into it)."""
        at = (self.at or time.perf_counter()) - run_started
        return {"signal": self.why, "at_s": round(at, 3)}

    def handle_signal(self, signum: int, frame: Any) -> None:
        if self.requested.is_set():  # the second signal: no more waiting
            self.kill_now(128 + signum)
        log.warning(
            "%s: stopping (answers held are checkpointed; rerun to finish); "
            "send it again to exit at once",
            signal.Signals(signum).name,
        )
        self.request(signal.Signals(signum).name)

    def kill_now(self, code: int) -> None:
        for hook in list(self._on_kill):
            _quietly(hook)
        exit_now(code)

    def _stopping(self) -> None:
        for hook in list(self._on_stop):
            _quietly(hook)
        if not self._settle(self.stop_s * 0.75):
            log.warning("the stop is taking long: killing the engine")
            for hook in list(self._on_kill):
                _quietly(hook)
            if not self._settle(self.stop_s * 0.25):
                self._overran()
                return
        if self.exit_on_overrun:
            self._await_prefect()

    def _settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the flow body to end; a CLI run whose report is
        written and whose Prefect API is gone exits now (nothing left to wait for)."""
        deadline = time.perf_counter() + timeout
        while not self.finished.wait(min(_API_CHECK_S, max(0.0, deadline - time.perf_counter()))):
            if self.exit_on_overrun and self.report is not None and prefect_api_gone():
                self._exit_stopped("Prefect's API is gone")
            if time.perf_counter() >= deadline:
                return False
        return True

    def _await_prefect(self) -> None:
        """After the flow body: Prefect ends the flow run (Cancelled) through its API. A
        CLI run does not wait for an API that is gone, nor past run.stop_s."""
        deadline = (self.at or time.perf_counter()) + max(self.stop_s, 5.0)
        while not self.returned.wait(_API_CHECK_S):
            if prefect_api_gone() or time.perf_counter() > deadline:
                self._exit_stopped("Prefect's API did not answer")

    def _exit_stopped(self, why: str) -> None:
        if self.report is None:
            exit_now(128 + self.signum)
        with contextlib.suppress(Exception):
            from nightshift.console import screen

            print(
                f"stopped ({self.why}): the answers held are checkpointed and the report "
                f"is written; rerun the same command to answer the rest ({why}: the "
                "flow run's state was not updated)",
                file=screen(),
                flush=True,
            )
        exit_now(STOPPED_EXIT)

    def _overran(self) -> None:
        if self.exit_on_overrun:
            log.error("could not stop within run.stop_s (%gs): exiting now", self.stop_s)
            if self.report is not None:
                self._exit_stopped("run.stop_s ran out")
            self.kill_now(128 + self.signum)
        # A server: never its process. The engine is killed; the run ends when it can.
        log.error(
            "could not stop within run.stop_s (%gs): its engine was killed and the run "
            "is abandoned; it ends when its last step returns",
            self.stop_s,
        )
        self.abandoned = True


def exit_now(code: int) -> None:
    """End this process now with ``code``; every process it started dies first."""
    from nightshift.engines.processes import kill_children

    with contextlib.suppress(Exception):
        kill_children()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def overrun_exits(exits: bool = True) -> Iterator[None]:
    """Within the block, a flow body's stop past run.stop_s ends the process (the CLI's
    ``jobs run``, ``jobs work``, ``batch run``); elsewhere it abandons the run."""
    global _exit_on_overrun
    previous, _exit_on_overrun = _exit_on_overrun, exits
    try:
        yield
    finally:
        _exit_on_overrun = previous


def install_process_handlers() -> None:
    """SIGTERM and SIGINT end the command from its first line, before any flow body
    installs its graceful stop; call it as the process starts. Outside a flow body
    there is nothing to checkpoint: the process ends (exit code 3) and every process it
    started (Prefect's temporary server, an engine starting) dies with it. Not by an
    exception: one raised into arbitrary code (an import, pydantic) can be swallowed."""
    if threading.current_thread() is threading.main_thread():
        for s in _SIGNALS:
            signal.signal(s, _outside_a_run)


def python_signal_defaults() -> None:
    """Python's own handling back (KeyboardInterrupt on Ctrl-C), for a command that
    leaves its signals to Prefect (``schedule serve``: its runner stops its flow runs,
    which must not be killed with this process)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def raising_signals() -> Iterator[None]:
    """Within the block a signal outside a flow body raises ``SignalStop`` instead, for
    a caller that ends gracefully on it (``batch serve``: uvicorn shuts down, then
    raises the signal again)."""
    global _raising
    previous, _raising = _raising, True
    try:
        yield
    finally:
        _raising = previous


def _outside_a_run(signum: int, frame: Any) -> None:
    stop = _last if _last is not None and _last.has_signals else None  # not a server's job
    if stop is not None and stop.requested.is_set() and not stop.returned.is_set():
        stop.kill_now(128 + signum)  # a second signal while Prefect ends the flow run
    if _raising:
        raise SignalStop(signum)
    log.warning("%s: stopping", signal.Signals(signum).name)
    exit_now(STOPPED_EXIT)


def prefect_api_gone(ask: bool = True) -> bool:
    """Whether Prefect's API is gone: the temporary server this process started has
    exited, or (``ask``) the user's server does not answer its health check in 2 s."""
    gone = tempserver.gone()
    if gone is not None:
        return gone
    url = os.environ.get("PREFECT_API_URL")
    if not ask or not url:
        return False
    import httpx

    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=2.0).status_code >= 500
    except httpx.HTTPError:
        return True


@contextlib.contextmanager
def graceful_stop(stop_s: float, flow_run_id: Any = None) -> Iterator[GracefulStop]:
    """Stop the enclosed flow body gracefully on SIGTERM, SIGINT or a cancellation of
    ``flow_run_id``. Call it inside the flow body (see the module docstring)."""
    global _last
    stop = _last = GracefulStop(stop_s, _exit_on_overrun)
    with _signals(stop):
        if flow_run_id is not None:
            _watch_cancellation(stop, flow_run_id)
        try:
            yield stop
        finally:
            stop.finished.set()


def last_stop() -> GracefulStop | None:
    """The stop of the flow body run last in this process (the CLI reads its report)."""
    return _last


def flow_returned(before: GracefulStop | None) -> None:
    """The flow call that began after ``before`` returned: its stop waits no more."""
    stop = _last
    if stop is not None and stop is not before:
        stop.returned.set()


@contextlib.contextmanager
def _signals(stop: GracefulStop) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread's handlers
        return
    stop.has_signals = True
    previous = {s: signal.signal(s, stop.handle_signal) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _watch_cancellation(stop: GracefulStop, flow_run_id: Any) -> None:
    """Poll the flow run's state; a CANCELLING (or CANCELLED) run stops."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType

    def poll() -> None:
        with get_client(sync_client=True) as client:
            while not stop.finished.wait(CANCEL_POLL_S) and not stop.requested.is_set():
                try:
                    state = client.read_flow_run(flow_run_id).state
                except Exception:  # the server is busy or gone: ask again later
                    continue
                if state is not None and state.type in (StateType.CANCELLING, StateType.CANCELLED):
                    log.warning("the flow run was cancelled: stopping")
                    stop.request("cancelled")

    threading.Thread(target=poll, name="nightshift-cancel-watch", daemon=True).start()


def cancelled_state(stop: GracefulStop):
    """The state a stopped flow run ends in."""
    from prefect.states import Cancelled

    return Cancelled(message=f"stopped ({stop.why}); rerun to finish what is left")


def _quietly(hook: Callable[[], None]) -> None:
    try:
        hook()
    except Exception:  # one hook failing must not keep the others from running
        log.exception("stop hook %r failed", hook)
