"""What becomes of a shard once it leaves the engine: checkpointed, committed, failed,
stopped, or given up to the worker that took it over.

Each shard keeps its answers in memory until ``run.chunk_records`` of them or
``run.chunk_seconds`` have passed, then checkpoints them as a chunk; when its last
record is answered it commits (see ``io.shardstore``). An engine that dies fails the
attempt of every shard it was working on: what they checkpointed stays, and they
continue on a fresh engine, up to ``run.shard_attempts`` times. A stop settles the open
shards as stopped, with no attempt counted. ``ShardRunner`` (``running.shards``) feeds
the records; this is its bookkeeping, apart from the stream.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable

from nightshift.errors import EngineFatalError, LeaseLostError, StoreAccessError, StoreError
from nightshift.io.shardstore import ShardStore
from nightshift.jobs.spec import JobSpec
from nightshift.memory import give_back_now_and_then
from nightshift.running.committing import BackgroundCommits
from nightshift.running.progress import LiveProgress
from nightshift.running.results import ResultTables
from nightshift.running.shardqueue import ShardQueue
from nightshift.running.shardwork import ShardWork, shard_summary

log = logging.getLogger(__name__)


class ShardSettling:
    """The shards of one run and how each was settled: ``committed``, ``failures``,
    ``stopped``, ``lost`` (its lease), with the ``attempts`` counted against each.

    ``retry_in_place`` retries a shard whose engine died right here, up to
    ``run.shard_attempts``; a caller with its own retries (a Prefect task) turns it off,
    so that one engine death fails the shard's attempt and the caller decides."""

    def __init__(
        self,
        spec: JobSpec,
        shards: ShardStore,
        tables: ResultTables,
        progress: LiveProgress,
        retry_in_place: bool,
    ) -> None:
        self.spec, self.shards, self.tables, self.progress = spec, shards, tables, progress
        self.retry_in_place = retry_in_place
        # shard -> set by a worker's lease keeper when another worker took it over.
        self.lease_lost: dict[int, threading.Event] = {}
        self.lost: set[int] = set()  # shards given up here because their lease was lost
        self.attempt = uuid.uuid4().hex[:8]
        self.attempts: Counter = Counter()
        self.failures: dict[int, str] = {}
        self.committed: list[int] = []
        self.on_settled: Callable[[int], None] | None = None  # a shard committed or failed
        self._rerun: list[int] = []  # shards ``run`` tries again (retry_in_place)
        self.stopping = threading.Event()  # request_stop: the run is stopping
        self.stopped: set[int] = set()  # shards settled uncommitted because of a stop
        self.commits = BackgroundCommits()  # finished shards, committed off the feeding thread

    def _due(self, w: ShardWork) -> bool:
        run = self.spec.run
        return w.held >= run.chunk_records or time.monotonic() - w.since >= run.chunk_seconds

    def _check_lease(self, shard: int) -> None:
        lost = self.lease_lost.get(shard)
        if lost is not None and lost.is_set():
            raise LeaseLostError(f"shard {shard}: another worker took it over")

    def _give_up(self, w: ShardWork, exc: LeaseLostError) -> None:
        """Another worker took ``w`` over: write nothing more of it, and settle it."""
        self.lost.add(w.shard)
        self.failures[w.shard] = str(exc)
        self._settled(w.shard)

    def _checkpoint(self, w: ShardWork) -> None:
        if not w.held:
            return
        self._check_lease(w.shard)
        tables = {
            "ok": self.tables.results_table(w.ok),
            "failed": self.tables.failed_table(w.failed),
        }
        w.files = w.files + self.shards.write_chunk(w.shard, self.attempt, w.chunks, tables)
        w.chunks += 1
        w.done_ids.update(r[self.spec.input.id_column] for r in w.ok + w.failed)
        w.ok, w.failed, w.since = [], [], time.monotonic()
        give_back_now_and_then()  # what this thread freed (Arrow keeps it per thread)

    def _finish(self, w: ShardWork) -> None:
        """``w`` has every answer: checkpoint the ones it holds, then commit it on the
        commit thread (``running.committing``). The checkpoint comes first so that a kill
        while the commit waits loses none of this shard's answers: a rerun commits it from
        its chunks, and a kill still redoes at most the open shards' last chunks."""
        try:
            self._checkpoint(w)
        except LeaseLostError as exc:  # ``w`` is out of ``work`` already
            self._give_up(w, exc)
            return
        attempts = self.attempts[w.shard] + 1  # counted now: the feeding thread changes it
        self.commits.submit(lambda: self._commit(w, attempts))

    def _commit(self, w: ShardWork, attempts: int) -> None:
        """Merge the shard's chunks and held answers, check it reconciles, commit it
        (on the commit thread)."""
        try:
            if self.shards.marker(w.shard) is not None:  # a retry of a commit that got there
                self.shards.forget_work(w.shard)
                self._committed(w)
                return
            merged = w.merged(self.shards, self.tables, self.spec.input.id_column)
            summary = shard_summary(merged.ok, merged.failed, w.planned, attempts)
            self._check_lease(w.shard)
            tables = {"ok": merged.ok_parts(), "failed": merged.failed}
            if not self.shards.commit(w.shard, self.attempt, tables, summary):
                log.warning(
                    "shard %d was committed by another attempt; this one's copy is dropped",
                    w.shard,
                )
        except LeaseLostError as exc:
            self._give_up(w, exc)
            return
        except StoreError as exc:
            if isinstance(exc, StoreAccessError):
                raise  # the user's to fix (credentials, bucket): the run stops, as before
            self._commit_failed(w, exc)
            return
        self._committed(w)

    def _committed(self, w: ShardWork) -> None:
        self.committed.append(w.shard)
        self.progress.shard_done(w.shard, w.planned)
        w.ok, w.failed = [], []
        self._settled(w.shard)

    def _commit_failed(self, w: ShardWork, exc: StoreError) -> None:
        """The store failed the shard's commit: unless its marker got written after all,
        the shard settles as failed, for a retry or a rerun to continue from its chunks
        (``_finish`` checkpointed every answer before the hand-over). The run goes on;
        with ``retry_in_place`` the shard runs again here, as after an engine death."""
        try:
            committed = self.shards.marker(w.shard) is not None
        except StoreError as again:
            if isinstance(again, StoreAccessError):
                raise
            committed = False  # the retry reads the marker again before it writes
        if committed:
            log.warning(
                "shard %d is committed (its marker exists: this attempt's, or another's "
                "that won it); this attempt's commit failed: %s",
                w.shard,
                exc,
            )
            self._committed(w)
            return
        reason = f"its commit failed: {exc}"
        log.error("shard %d: %s", w.shard, reason)
        if self._fail_or_rerun(w, reason):
            self._rerun.append(w.shard)  # read by ``run`` once the commits have drained

    def _settled(self, shard: int) -> None:
        if self.on_settled is not None:
            self.on_settled(shard)

    def _fail_or_rerun(self, w: ShardWork, reason: str) -> bool:
        """Count an attempt of ``w``; True when it may run again here, else it is
        named failed (and stays resumable from its checkpoints)."""
        self.attempts[w.shard] += 1
        if self.retry_in_place and self.attempts[w.shard] < self.spec.run.shard_attempts:
            return True
        self.failures[w.shard] = reason
        self._settled(w.shard)
        return False

    def _after_crash(
        self, work: dict[int, ShardWork], exc: EngineFatalError, queue: ShardQueue
    ) -> None:
        """Checkpoint what the dead engine answered; count an attempt for each shard it
        was working on (the first open one, if it died before answering any). The
        others, and those with attempts left, go back to the front of the queue."""
        hit = [w for w in work.values() if w.answered_now] or list(work.values())[:1]
        again = []
        for w in work.values():
            if not self._checkpoint_held(w):
                continue
            if w not in hit or self._fail_or_rerun(w, str(exc)):
                again.append(w.shard)
        for shard in reversed(again):
            queue.put(shard, front=True)
        work.clear()
        if again:
            log.warning("engine died (%s); shards %s go on on a fresh engine", exc, again)

    def _stop_open(self, work: dict[int, ShardWork]) -> None:
        """The run is stopping: checkpoint the answers each open shard holds and settle
        it as stopped (no attempt counted; a rerun continues it)."""
        for w in list(work.values()):
            if self._checkpoint_held(w):
                self.stopped.add(w.shard)
                self._settled(w.shard)
        work.clear()

    def _checkpoint_held(self, w: ShardWork) -> bool:
        """Checkpoint ``w``'s answers before it leaves this engine; False (and ``w`` given
        up) when another worker took it over."""
        try:
            self._checkpoint(w)
        except LeaseLostError as lost:
            self._give_up(w, lost)
            return False
        w.answered_now = 0
        return True

    def _unanswered(self, w: ShardWork) -> None:
        """Every request of ``w`` came back, some of them aborted (no answers): checkpoint
        the answers, and run the shard again here or name it failed."""
        if self.stopping.is_set():  # aborted because the run is stopping: no attempt
            self._stop_open({w.shard: w})
            return
        left = w.remaining
        if not self._checkpoint_held(w):
            return
        reason = (
            f"{left} record(s) left unanswered (the engine aborted them); "
            "they are asked again on the next attempt"
        )
        if self._fail_or_rerun(w, reason):
            log.warning("shard %d: %d record(s) left unanswered; asking again", w.shard, left)
            self._rerun.append(w.shard)
