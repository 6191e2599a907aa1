"""One engine fed from a job's first record to its last, while shards come and go.

Each shard stays the unit of checkpoint, commit and retry, and shows in Prefect as its
own task run; but no shard task owns the engine. A task ``submit``s its shard and waits
for it to settle; a feeding thread runs ``ShardRunner.feed_shards`` over every shard
submitted, so the next shard's records are already in the engine's batch when the
previous one commits (no drain at shard boundaries). A shard whose engine died, or
whose records were left unanswered, settles as failed (``ShardAttemptFailed``) and its
task's retry submits it again; the other shards go on. ``request_stop`` (a signal, a
Prefect cancellation) ends the loop early: every shard not committed settles with
``RunStoppedError``, which is never retried.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from nightshift.errors import LeaseLostError, NightshiftError, RunStoppedError, ShardAttemptFailed
from nightshift.running.shardqueue import ShardQueue
from nightshift.running.shards import EngineSource, ShardRunner


class FeedingLoop:
    def __init__(self, runner: ShardRunner, engines: EngineSource) -> None:
        self.runner, self.engines = runner, engines
        self.queue = ShardQueue()
        self.error: BaseException | None = None  # what stopped the loop, for later submits
        self._futures: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        runner.on_settled = self._settled

    def expect(self, shards: list[int]) -> None:
        """Announce shards about to be submitted: they are fed in this order (the plan's),
        whatever order their tasks submit them in."""
        self.queue.expect(shards)

    def submit(self, shard: int) -> Future:
        """Feed ``shard`` after those submitted before it; the future gives the shard
        once committed, or raises why it was not."""
        future: Future = Future()
        with self._lock:
            if self.error is not None:
                future.set_exception(self.error)
                return future
            self._futures[shard] = future
            if self._thread is None:
                self._thread = threading.Thread(target=self._feed, name="nightshift-feeding")
                self._thread.start()
        self.queue.put(shard)
        return future

    def run(self, shard: int) -> int:
        """Submit ``shard`` and wait for it (what a shard task does)."""
        return self.submit(shard).result()

    def request_stop(self, why: str = "the run was stopped") -> None:
        """Stop feeding: open shards checkpoint what they hold and fail with
        ``RunStoppedError``, as do those waiting and any submitted later. Thread-safe."""
        with self._lock:
            if self.error is None:
                self.error = RunStoppedError(f"{why} before this shard committed; rerun to finish")
        self.runner.request_stop()
        self.queue.close()  # wakes a feeding thread waiting for the next shard

    def close(self) -> None:
        """No more shards: the loop ends once those submitted have settled."""
        self.queue.close()
        if self._thread is not None:
            self._thread.join()

    def _feed(self) -> None:
        try:
            with collector_skips_what_exists():
                self.runner.feed_shards(self.queue, self.engines)
        except BaseException as exc:  # a job-level stop (lease lost, all failing): tell all
            with self._lock:
                self.error = exc
        finally:
            self._fail_unsettled()

    def _settled(self, shard: int) -> None:
        with self._lock:
            future = self._futures.pop(shard, None)
        if future is None:
            return
        failure = self.runner.failures.get(shard)
        if shard in self.runner.stopped:
            future.set_exception(RunStoppedError(f"shard {shard}: {self.error}"))
        elif shard in self.runner.lost:
            future.set_exception(LeaseLostError(failure))
        elif failure is not None:
            future.set_exception(ShardAttemptFailed(f"shard {shard}: {failure}"))
        else:
            future.set_result(shard)

    def _fail_unsettled(self) -> None:
        with self._lock:
            left, self._futures = self._futures, {}
            if self.error is None and left:
                self.error = NightshiftError(f"the feeding loop ended before {sorted(left)}")
        for future in left.values():
            future.set_exception(self.error)


FEEDING_GC_THRESHOLD = (20_000, 20, 100)  # Python's default: (700, 10, 10)


@contextlib.contextmanager
def collector_skips_what_exists() -> Iterator[None]:
    """Everything alive when the feed starts (imports, Prefect, the plan's keys) is kept
    out of the cycle collector's full passes while it runs (``gc.freeze``): each pass
    walked all of it again, 0.3-0.5 s every 15-20 s at a million records, and found
    nothing. Let back in after, so a process that runs job after job frees as before;
    left frozen where something else (another feed, the host) had frozen them first."""
    frozen_already = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        with _collector_runs_less():
            yield
    finally:
        if not frozen_already:
            gc.unfreeze()


_feeds_lock = threading.Lock()
_feeds: dict[str, Any] = {"running": 0, "threshold_before": gc.get_threshold()}


@contextlib.contextmanager
def _collector_runs_less() -> Iterator[None]:
    """While any feed runs, the collector runs less often (``FEEDING_GC_THRESHOLD``): a
    record makes a dozen containers (its ids, request, result, row), so at Python's
    default a young pass came every 60 records and walked the rows a chunk holds: 1.1 s
    of a 100,000-ticket run's process went to the collector, 0.2 s since. The feed
    makes no cycles that wait on it; its garbage goes by reference counts. The threshold
    before is put back when the last feed of the process ends."""
    with _feeds_lock:
        if not _feeds["running"]:
            _feeds["threshold_before"] = gc.get_threshold()
            gc.set_threshold(*FEEDING_GC_THRESHOLD)
        _feeds["running"] += 1
    try:
        yield
    finally:
        with _feeds_lock:
            _feeds["running"] -= 1
            if not _feeds["running"]:
                gc.set_threshold(*_feeds["threshold_before"])
