"""The server's worker: batches run one at a time, first in first out, one engine.

The queue is the store itself: every unfinished batch record, oldest first. So a server
started again after a kill finds the batch it was running (and resumes its job, whose
work folder holds what was answered) and those that waited behind it, in order.

A cancel, or the server shutting down, stops the running job gracefully, the way
SIGTERM stops ``nightshift jobs run`` (``pipelines.stops``): answers held are
checkpointed and the flow run ends Cancelled. A cancelled batch then gets its partial
results; one stopped by a shutdown stays unfinished and carries on at the next start.
Between batches the engine stays up (``running.engines.warm_engines``) for the next
batch with the same engine settings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from nightshift.batch.execute import JobStopped
from nightshift.batch.store import UNFINISHED, BatchStore
from nightshift.errors import UserError
from nightshift.pipelines import stops
from nightshift.running.engines import warm_engines

log = logging.getLogger(__name__)
Runner = Callable[[dict[str, Any]], dict[str, int]]
Finisher = Callable[..., None]  # (record, counts | None, how, errors=None)
Validator = Callable[[dict[str, Any]], list[dict[str, Any]]]  # a record's input problems


class BatchQueue:
    """Runs unfinished batch records in ``seq`` order in one thread. ``run`` runs a
    record's job; ``finish(record, counts, status)`` writes its end state."""

    def __init__(
        self,
        batches: BatchStore,
        run: Runner,
        finish: Finisher,
        poll_s: float = 1.0,
        validate: Validator | None = None,
    ):
        self.batches, self._run, self._finish, self.poll_s = batches, run, finish, poll_s
        self._validate = validate or (lambda record: [])
        self.current: str | None = None
        self._claim = threading.Lock()  # the worker taking a batch vs a cancel ending it
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._stop_wanted = threading.Event()  # stop the current run (cancel or shutdown)
        self._thread = threading.Thread(target=self._loop, name="nightshift-batches", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def cancel(self, batch_id: str) -> None:
        """The record is marked cancelling already: stop its job if it is running; one
        still waiting in the queue ends cancelled now, not once those before it ran."""
        with self._claim:
            if self.current == batch_id:
                self._stop_wanted.set()
            else:
                record = self.batches.batch(batch_id)
                if record and record["status"] == "cancelling" and not record["in_progress_at"]:
                    self._finish(record, None, "cancelled")
        self._wake.set()

    def shutdown(self, timeout: float) -> None:
        """Stop the running job gracefully (it resumes at the next start) and wait."""
        self._closing.set()
        self._stop_wanted.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        with warm_engines():  # batches of the same engine settings share one engine
            self._serve()

    def _serve(self) -> None:
        while not self._closing.is_set():
            record = self._next()
            if record is None:
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            try:
                self._run_one(record)
            except Exception:  # a store failure: log it, try again later
                log.exception("batch %s could not be run", record["id"])
                self._closing.wait(self.poll_s * 5)

    def _next(self) -> dict[str, Any] | None:
        waiting = [
            r
            for kind in ("batch", "msgbatch")
            for r in self.batches.batches(kind)
            if r["status"] in UNFINISHED
        ]
        return min(waiting, key=lambda r: (r["seq"], r["id"]), default=None)

    def _claimed(self, batch_id: str) -> dict[str, Any] | None:
        """The record, marked running and current; None if it needs no run (it ended,
        or it was cancelled or failed validation before it started)."""
        record = self.batches.batch(batch_id)
        problems = self._validate(record) if record and record["status"] == "validating" else []
        with self._claim:
            record = self.batches.batch(batch_id)  # a cancel may have come meanwhile
            if record is None or record["status"] not in UNFINISHED:
                return None
            if record["status"] == "cancelling" and not record["in_progress_at"]:
                self._finish(record, None, "cancelled")  # never started: nothing to stop
                return None
            if problems and record["status"] == "validating":
                self._finish(record, None, f"failed: {problems[0]['message']}", problems)
                return None
            record = self._mark_running(batch_id) or record
            self.current = batch_id
            self._stop_wanted.clear()
            if record["status"] == "cancelling":
                self._stop_wanted.set()  # a cancel of the run resumed now
            return record

    def _run_one(self, record: dict[str, Any]) -> None:
        record = self._claimed(record["id"])
        if record is None:
            return
        watcher = _StopWatcher(self._stop_wanted)
        try:
            counts = self._run(record)
        except JobStopped:
            return  # unfinished: run again (resumed) by the next start or the next turn
        except Exception as exc:
            if self._closing.is_set():
                return  # stopped by the shutdown: resumes at the next start
            if isinstance(exc, UserError):
                log.warning("batch %s failed: %s", record["id"], exc)
                why = str(exc)
            else:  # a bug: its traceback goes to the log, not to the client
                log.exception("batch %s failed", record["id"])
                why = "the batch's job failed unexpectedly; the server's log says why"
            self._finish(record, None, f"failed: {why}")
            return
        finally:
            watcher.done()
            self.current = None
        if self._closing.is_set() and not self._cancelling(record["id"]):
            return
        self._finish(record, counts, "cancelled" if self._cancelling(record["id"]) else "completed")

    def _mark_running(self, batch_id: str) -> dict[str, Any] | None:
        def change(record: dict[str, Any]) -> dict[str, Any] | None:
            if record["status"] != "validating":
                return None
            return {**record, "status": "in_progress", "in_progress_at": int(time.time())}

        return self.batches.update_batch(batch_id, change)

    def _cancelling(self, batch_id: str) -> bool:
        record = self.batches.batch(batch_id)
        return record is not None and record["status"] == "cancelling"


class _StopWatcher:
    """Requests a graceful stop of the flow run started after it, once ``wanted`` is set.

    The flow body creates its stop only when it starts (``stops.graceful_stop``), so a
    stop wanted earlier waits for it; one wanted after the run ended is dropped."""

    def __init__(self, wanted: threading.Event, poll_s: float = 0.2) -> None:
        self._wanted, self._poll_s = wanted, poll_s
        self._before = stops.last_stop()
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="nightshift-batch-stop", daemon=True).start()

    def done(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(self._poll_s):
            stop = stops.last_stop()
            if self._wanted.is_set() and stop is not None and stop is not self._before:
                if not stop.finished.is_set():
                    stop.request("cancelled")
                return
