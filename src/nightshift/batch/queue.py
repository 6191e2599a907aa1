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
from nightshift.batch.lifecycle import announce
from nightshift.batch.progress import expired
from nightshift.batch.store import UNFINISHED, BatchStore
from nightshift.errors import StoreError, UserError
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

    STORE_ATTEMPTS = 5  # turns a batch may fail on the store before it fails for good

    def _serve(self) -> None:
        """Run the next batch, again and again. A turn that fails outside the batch's
        job (the store, or a bug in validating it) never stalls the queue: a store
        failure puts that batch aside for a while (backing off, ``STORE_ATTEMPTS`` turns
        at most) and the batches behind it go first; anything else fails it now."""
        retries = _Retries(self.poll_s * 5, self.poll_s * 300)
        while not self._closing.is_set():
            record = self._pick(retries)
            if record is None:
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            if record["id"] in retries.given_up:
                self._fail_turn(record, retries)
                continue
            try:
                self._run_one(record)
            except Exception as exc:
                if self._closing.is_set():
                    return  # a shutdown under way: the next start takes the batch up
                self._turn_failed(record, exc, retries)
            else:
                retries.forget(record["id"])

    def _pick(self, retries: _Retries) -> dict[str, Any] | None:
        """The next batch to run, passing over those waiting out a store failure."""
        try:
            record = self._next()
            if record is not None and record["id"] in retries.waiting():
                record = self.batches.next_unfinished(skip=retries.waiting())
            return record
        except Exception:  # the store is down: the worker waits, it never dies of it
            log.exception("the batch queue cannot be read; trying again")
            self._closing.wait(self.poll_s * 5)
            return None

    def _turn_failed(self, record: dict[str, Any], exc: Exception, retries: _Retries) -> None:
        batch_id = record["id"]
        if isinstance(exc, StoreError | OSError):
            failures = retries.failed(batch_id)
            log.warning(
                "batch %s: the store failed (%s), turn %d of %d; the batches behind it go "
                "first", batch_id, exc, failures, self.STORE_ATTEMPTS,
            )  # fmt: skip
            if failures < self.STORE_ATTEMPTS:
                return
            why = (
                f"the server's store failed {failures} times while this batch was started "
                "or finished; the server's log says why"
            )
        else:  # a bug: its traceback goes to the log, never the same failure for ever
            log.exception("batch %s could not be run", batch_id)
            step = "validated" if self._status(record) == "validating" else "run"
            why = f"this batch could not be {step} (an unexpected error: the server's log says why)"
        retries.give_up(batch_id, why)
        self._fail_turn(record, retries)

    def _status(self, record: dict[str, Any]) -> str:
        """The record's status now (still validating: the failure was in validation)."""
        try:
            return (self.batches.batch(record["id"]) or record)["status"]
        except Exception:
            return record["status"]

    def _fail_turn(self, record: dict[str, Any], retries: _Retries) -> None:
        """End a batch given up; if even that fails, a later turn tries again."""
        batch_id = record["id"]
        try:
            with self._claim:  # against a cancel ending it meanwhile
                current = self.batches.batch(batch_id)
                if current is not None and current["status"] in UNFINISHED:
                    self._finish(current, None, f"failed: {retries.given_up[batch_id]}")
        except Exception:
            log.exception("batch %s could not be marked failed; trying again later", batch_id)
            retries.failed(batch_id)
        else:
            retries.forget(batch_id)

    def _next(self) -> dict[str, Any] | None:
        # The pending index, not every record: an idle server polls this each second.
        return self.batches.next_unfinished()

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
            step = "started" if record["status"] == "validating" else "resumed"
            record = self._mark_running(batch_id) or record
            announce(record, step)
            self.current = batch_id
            self._stop_wanted.clear()
            if record["status"] == "cancelling":
                self._stop_wanted.set()  # a cancel of the run resumed now
            return record

    def _run_one(self, record: dict[str, Any]) -> None:
        record = self._claimed(record["id"])
        if record is None:
            return
        watcher = _StopWatcher(self._stop_wanted, record)
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
        how = counts.pop("how", None)  # "expired": its window passed while it ran
        if how is None and self._closing.is_set() and not self._cancelling(record["id"]):
            return
        how = how or ("cancelled" if self._cancelling(record["id"]) else "completed")
        self._finish(record, counts, how)

    def _mark_running(self, batch_id: str) -> dict[str, Any] | None:
        def change(record: dict[str, Any]) -> dict[str, Any] | None:
            if record["status"] != "validating":
                return None
            return {**record, "status": "in_progress", "in_progress_at": int(time.time())}

        return self.batches.update_batch(batch_id, change)

    def _cancelling(self, batch_id: str) -> bool:
        record = self.batches.batch(batch_id)
        return record is not None and record["status"] == "cancelling"


class _Retries:
    """The batches whose turns failed on the store: when each may have its next turn
    (``base_s`` after the first failure, doubling up to ``most_s``), and those given up,
    whose next turn only fails them (with the reason kept here)."""

    def __init__(self, base_s: float, most_s: float) -> None:
        self.base_s, self.most_s = base_s, most_s
        self._due: dict[str, tuple[int, float]] = {}  # id -> (failures, next turn at)
        self.given_up: dict[str, str] = {}

    def waiting(self) -> frozenset[str]:
        now = time.monotonic()
        return frozenset(i for i, (_, due) in self._due.items() if due > now)

    def failed(self, batch_id: str) -> int:
        failures = self._due.get(batch_id, (0, 0.0))[0] + 1
        wait = min(self.base_s * 2 ** (failures - 1), self.most_s)
        self._due[batch_id] = (failures, time.monotonic() + wait)
        return failures

    def give_up(self, batch_id: str, why: str) -> None:
        self.given_up[batch_id] = why
        self._due.setdefault(batch_id, (0, 0.0))

    def forget(self, batch_id: str) -> None:
        self._due.pop(batch_id, None)
        self.given_up.pop(batch_id, None)


class _StopWatcher:
    """Requests a graceful stop of the flow run started after it, once ``wanted`` is set
    or ``record``'s completion window has passed (``batch.progress.expired``).

    The flow body creates its stop only when it starts (``stops.graceful_stop``), so a
    stop wanted earlier waits for it; one wanted after the run ended is dropped."""

    def __init__(self, wanted: threading.Event, record: dict, poll_s: float = 0.2) -> None:
        self._wanted, self._poll_s, self._record = wanted, poll_s, record
        self._before = stops.last_stop()
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="nightshift-batch-stop", daemon=True).start()

    def done(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(self._poll_s):
            stop = stops.last_stop()
            why = "cancelled" if self._wanted.is_set() else None
            why = why or ("expired" if expired(self._record) else None)
            if why and stop is not None and stop is not self._before:
                if not stop.finished.is_set():
                    stop.request(why)
                return
