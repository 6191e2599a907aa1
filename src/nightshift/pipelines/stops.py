"""Graceful stops: SIGTERM, a first Ctrl-C (SIGINT), or a Prefect cancellation.

A stop stops feeding, checkpoints every answer held, releases leases, shuts the engine
down and writes the report marked as stopped; ``nightshift jobs run`` then exits with
``STOPPED_EXIT`` (3). Requests in flight are aborted and are no answers. A second
signal exits at once (128 + its number, as a shell reports a killed process), and so
does a stop still unfinished after ``run.stop_s`` (its engine is killed at 3/4 of it,
so a hung step cannot hold the stop up).

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
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)
STOPPED_EXIT = 3  # exit code of a run stopped gracefully: rerun the command to finish
CANCEL_POLL_S = 2.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_last: GracefulStop | None = None


class GracefulStop:
    """One flow run's stop: requested once (by a signal or a cancellation); ``on_stop``
    hooks run in a thread of their own, never in the signal handler."""

    def __init__(self, stop_s: float) -> None:
        self.stop_s = stop_s
        self.requested = threading.Event()
        self.finished = threading.Event()  # the flow body is done: no deadline any more
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
        os._exit(code)

    def _stopping(self) -> None:
        for hook in list(self._on_stop):
            _quietly(hook)
        if self.finished.wait(self.stop_s * 0.75):
            return
        log.warning("the stop is taking long: killing the engine")
        for hook in list(self._on_kill):
            _quietly(hook)
        if not self.finished.wait(self.stop_s * 0.25):
            log.error("could not stop within run.stop_s (%gs): exiting now", self.stop_s)
            self.kill_now(128 + self.signum)


@contextlib.contextmanager
def graceful_stop(stop_s: float, flow_run_id: Any = None) -> Iterator[GracefulStop]:
    """Stop the enclosed flow body gracefully on SIGTERM, SIGINT or a cancellation of
    ``flow_run_id``. Call it inside the flow body (see the module docstring)."""
    global _last
    stop = _last = GracefulStop(stop_s)
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


@contextlib.contextmanager
def _signals(stop: GracefulStop) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread's handlers
        return
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
