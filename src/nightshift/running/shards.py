"""Run shards through an engine: checkpoint as they go, commit each when it is whole.

Records stream through one engine across shard boundaries (the batch never drains
between shards), and each answer becomes a row of its shard. A per-record error is a
failed row and the shard goes on. How a shard's answers are checkpointed, and how it
is then committed, retried after an engine died, or stopped, is ``running.settling``.
A run asked to stop (``request_stop``) feeds no more, checkpoints every answer it holds
and settles its open shards as stopped, with no attempt counted: the requests in flight
are aborted, and none of them is an answer.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Protocol

from nightshift.engines.base import Engine, EngineRequest, EngineResult
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import (
    EngineFatalError,
    EngineStalledError,
    JobAbortedError,
    LeaseLostError,
)
from nightshift.io.planstore import PlanStore, input_schema
from nightshift.io.shardstore import ShardStore
from nightshift.jobs.kept import kept_columns
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import sampling_for
from nightshift.running.cached import RunCache, canary_answers
from nightshift.running.calibration import LabelCalibration
from nightshift.running.copies import CopyBook, copy_rows, not_sent
from nightshift.running.encoding import encode_processes
from nightshift.running.feed import END, RequestFeed
from nightshift.running.progress import LiveProgress
from nightshift.running.results import ResultTables
from nightshift.running.settling import ShardSettling
from nightshift.running.shardqueue import ShardQueue
from nightshift.running.shardwork import ShardWork
from nightshift.running.totals import RunTotals

FAIL_FAST_RECORDS = 50
IDLE_WAIT_S = 0.05  # with nothing in flight, how long the feed waits for a shard to come
COMMIT_POLL_S = 1.0  # with no shard open, how often the wait for one checks the commits


class EngineSource(Protocol):
    """Hands out a warm engine, and a fresh one after a crash (see ``runner.EnginePool``)."""

    def acquire(self) -> Engine: ...

    def discard(self, engine: Engine) -> None:
        """Give back an engine that died; the next ``acquire`` builds a new one."""


class ShardRunner(ShardSettling):
    """Runs the uncommitted shards of one planned job: streams their records through one
    engine and turns each answer into a row of its shard; how a shard is then settled
    (checkpoint, commit, retry, stop) is ``ShardSettling``'s (``running.settling``)."""

    def __init__(
        self,
        spec: JobSpec,
        plans: PlanStore,
        shards: ShardStore,
        manifest: dict[str, Any],
        encoder: PromptEncoder,
        progress: LiveProgress,
        retry_in_place: bool = True,
    ) -> None:
        self.plans, self.encoder = plans, encoder
        # classify scores its labels, by the calibration once measured (running.calibration)
        self.calibration = LabelCalibration.for_run(spec, plans, manifest, encoder)
        self.task = self.calibration.handler
        # input.keep_columns and the eval column, as far as the plan holds them (jobs.kept)
        self.kept = kept_columns(spec, input_schema(manifest).names)
        detail = spec.input.sampling_column is not None
        tables = ResultTables(
            input_schema(manifest),
            spec.input.id_column,
            self.kept,
            self.task,
            detail=detail,
            reasoning=bool(spec.model.reasoning),
        )
        super().__init__(spec, shards, tables, progress, retry_in_place)
        self.planned = {s["index"]: s["records"] for s in manifest["shards"]["each"]}
        self.copybook = CopyBook.load(plans, manifest)  # dedup: records answered from another
        self.saved: Counter = Counter()  # dedup: copies' rows written, tokens they saved
        # what each request is sent with, under each record's own (input.sampling_column)
        self._run_sampling = sampling_for(spec, self.task)
        self.cache = RunCache.open(spec, manifest, sampling_for(spec, self.task))  # cache.path
        # the canary's answers to its sample (pipelines.canary): none is generated twice
        self.canary_answers = canary_answers(plans, manifest, sampling_for(spec, self.task))
        self._keys = itertools.count()  # request keys, unique in this run (see feed)
        self.totals = RunTotals()
        self.engine_stalls = 0  # engines killed as hung (run.stall_s)
        self._engines: EngineSource | None = None

    def request_stop(self) -> None:
        """Stop feeding; the feeding thread then checkpoints what it holds and settles
        its open shards as ``stopped``. Any thread may call it."""
        self.stopping.set()
        interrupt = getattr(self._engines, "interrupt", None)
        if interrupt is not None:
            interrupt()  # an engine mid-batch returns after its current step

    def run(self, todo: list[int], engines: EngineSource) -> None:
        """Run ``todo`` to commit on one engine, retrying in place (``retry_in_place``)
        shards whose engine died or that were left with records unanswered."""
        while todo and not self.stopping.is_set():
            self._rerun = []
            self.feed_shards(ShardQueue(todo, closed=True), engines)
            todo = self._rerun

    def feed_shards(self, queue: ShardQueue, engines: EngineSource) -> None:
        """Feed the shards ``queue`` hands out to one engine without a break between
        them, until it is closed and every shard taken is settled: committed, failed
        (``failures``) or, with ``retry_in_place``, left to ``run`` to try again. An
        engine that dies is replaced and the shards it did not fail are fed again. Returns
        once every shard handed to the commit thread is committed."""
        try:
            self._feed_until_settled(queue, engines)
        except BaseException:
            self.commits.abandon_errors()
            raise
        self.commits.drain()

    def _feed_until_settled(self, queue: ShardQueue, engines: EngineSource) -> None:
        work: dict[int, ShardWork] = {}
        self._engines = engines
        while True:
            self._take_shards(queue, work, feed=None, wait=None)
            if not work or self.stopping.is_set():
                self._stop_open(work)
                return  # closed, and every shard settled (or stopping)
            # by the job's size, not the shards open now: a flow opens its first alone
            processes = encode_processes(sum(self.planned.values()), self.spec.run.encode_processes)
            feed = RequestFeed(
                self.spec, self.plans, self.encoder, self._keys, self.kept, self._run_sampling,
                processes,
            )  # fmt: skip
            try:
                for w in work.values():
                    feed.add(w.shard, w.skip)  # encoding starts now, not later
                engine = engines.acquire()
                try:
                    if not self.stopping.is_set():
                        self._generate(engine, feed, queue, work)
                    self._stop_open(work)  # none left open unless stopping
                    return
                except EngineFatalError as exc:
                    engines.discard(engine)
                    self.engine_stalls += isinstance(exc, EngineStalledError)
                    if self.stopping.is_set():  # killed by a stop that took too long
                        self._stop_open(work)
                        return
                    self._after_crash(work, exc, queue)
            finally:
                feed.close()  # also when the engine never started: no thread, no temp copy

    def _take_shards(
        self, queue: ShardQueue, work: dict[int, ShardWork], feed: RequestFeed | None, wait
    ) -> None:
        """Open the shards the queue has: one already whole commits at once, the others
        join ``work`` (and ``feed``). With nothing open, ``wait`` for one (None: until
        one comes or the queue is closed)."""
        while not self.stopping.is_set():
            poll = COMMIT_POLL_S if wait is None else wait
            shard = queue.take(wait=poll if not work else 0)
            if shard is None:
                if wait is None and not work and not queue.finished:
                    self.commits.check()  # waiting on the queue, not on a failed commit
                    continue
                return
            self.failures.pop(shard, None)  # a caller's retry starts it afresh
            self.lost.discard(shard)
            self.stopped.discard(shard)
            w = self._resume(shard)
            if w.remaining == 0:
                self._finish(w)  # every record already checkpointed: commit, no engine
                continue
            work[shard] = w
            if feed is not None:
                feed.add(shard, w.skip)

    def records_left(self, todo: list[int]) -> int:
        """Records of ``todo`` not yet checkpointed: what this run will answer."""
        # Overlapping attempts may have checkpointed a record twice: never below 0.
        done = {s: sum(f.rows for f in self.shards.checkpoint(s)) for s in todo}
        return sum(max(0, self.planned[s] - done[s]) for s in todo)

    def _resume(self, shard: int) -> ShardWork:
        files = self.shards.checkpoint(shard)
        work = ShardWork(shard, self.planned[shard], files, chunks=len(files))
        for table in self.shards.read(files, "ok") + self.shards.read(files, "failed"):
            work.done_ids.update(table.column(self.spec.input.id_column).to_pylist())
        # dedup: copies are never fed; they are answered with their original's row
        work.copies = self.copybook.for_shard(
            shard, self.spec.input.id_column, self.kept, work.done_ids
        )
        work.skip = work.done_ids | self.copybook.ids(shard)
        return work

    def _generate(
        self, engine: Engine, feed: RequestFeed, queue: ShardQueue, work: dict[int, ShardWork]
    ) -> None:
        if self.calibration.due:  # before the first answer: every row labels by it
            self.task = self.tables.task = self.calibration.measure_on(engine, self._keys)
        sampling = sampling_for(self.spec, self.task)
        results = engine.run(self._requests(feed, queue, work), sampling)
        with contextlib.closing(results):  # closing aborts what the engine still holds
            for result in results:
                self._take(feed, result, work)
                if self.stopping.is_set():
                    return  # the answers so far stay held, to be checkpointed

    def _requests(
        self, feed: RequestFeed, queue: ShardQueue, work: dict[int, ShardWork]
    ) -> Iterator[EngineRequest | None]:
        """The engine's request stream: each shard's records as the shard arrives, None
        while nothing is ready (the engine steps what it holds and asks again), ending
        once the queue is finished and every request came back."""
        while not self.stopping.is_set():
            # The rest of a batch being handed out goes at once: the queue and the shards
            # whose requests all came back are looked at between batches (run_path.py)
            request = feed.ready_request()
            if request is None:
                request = self._between_batches(feed, queue, work)
                if request is END:
                    return
            if request is not None and self._answered_from_cache(feed, request, work):
                continue  # cache.path had its answer: nothing sent
            yield request

    def _between_batches(
        self, feed: RequestFeed, queue: ShardQueue, work: dict[int, ShardWork]
    ) -> EngineRequest | None | object:
        """The next request once the feed's batch is out: the shards the queue has join
        the feed, a shard whose every request came back unanswered is settled. None when
        nothing is ready yet; ``END`` when the queue is finished and every request came
        back."""
        self._take_shards(queue, work, feed, wait=0)
        if queue.finished:
            feed.close_input()
        idle = not feed.in_flight
        request = feed.next_request(wait=IDLE_WAIT_S if idle else 0)
        if request is None:
            self.commits.check()  # nothing to send: a failed commit ends the wait
        for shard in feed.newly_fed():  # all its requests may be back already
            if shard in work and feed.stuck(shard):
                self._unanswered(work.pop(shard))
        if request is END and not idle:
            return None  # the answers still out come first
        return request

    def _answered_from_cache(
        self, feed: RequestFeed, request: EngineRequest, work: dict[int, ShardWork]
    ) -> bool:
        if self.cache is None and self.canary_answers is None:
            return False
        hit = None
        for cache in (self.cache, self.canary_answers):
            hit = hit or (cache.lookup(request) if cache is not None else None)
        if hit is not None:
            self._take(feed, hit, work)
        return hit is not None

    def _take(self, feed: RequestFeed, result: EngineResult, work: dict[int, ShardWork]) -> None:
        """One result: a row of its shard, or nothing when it is no answer."""
        if result.retryable and feed.retry(result.key):
            return
        pending = feed.answered(result.key)
        w = work.get(pending.shard)
        if w is None:  # its shard was given up (lease lost): the answer is not ours
            return
        try:
            self._record(feed, result, pending, w, work)
        except LeaseLostError as exc:
            self._give_up(work.pop(w.shard), exc)

    def _record(
        self, feed: RequestFeed, result: EngineResult, pending, w: ShardWork, work: dict
    ) -> None:
        if result.aborted:  # no answer: its record stays unanswered in this attempt
            if feed.stuck(w.shard) and w.remaining:
                self._unanswered(work.pop(w.shard))
            return
        if result.retryable:  # a transient error every time it was sent: a failed row
            result = replace(result, error=f"{result.error}; sent {pending.tries} times")
        row, ok = self.tables.row(pending.record_id, pending.kept, result, pending.adapter)
        w.answered_now += 1
        (w.ok if ok else w.failed).append(row)
        self.totals.count(not_sent(row) if self._from_cache(result.key) else row, ok)
        if self.cache is not None:
            self.cache.store(pending.token_ids, result, pending.sampling, pending.adapter)
        if w.copies:  # dedup: its repeats get its answer, in the same chunk
            id_column = self.spec.input.id_column
            for copy in copy_rows(w.copies, pending.record_id, row, id_column, self.saved):
                (w.ok if ok else w.failed).append(copy)
                self.totals.count(copy, ok)
        self.progress.answered(w.shard, self.totals)
        self._stop_if_everything_fails(w)
        if w.remaining == 0:
            self._finish(work.pop(w.shard))
        elif feed.stuck(w.shard):
            self._unanswered(work.pop(w.shard))
        elif self._due(w):
            self._checkpoint(w)

    def _from_cache(self, key: int) -> bool:
        """Whether the result of ``key`` came from cache.path or the canary, not the engine."""
        return (self.cache is not None and self.cache.from_cache(key)) or (
            self.canary_answers is not None and self.canary_answers.from_cache(key)
        )

    def _stop_if_everything_fails(self, w: ShardWork) -> None:
        """The first records all failing alike means the job is wrong, not the records
        (for example a JSON schema the engine cannot compile): stop before spending the rest."""
        if self.totals.ok or self.totals.failed != FAIL_FAST_RECORDS:
            return
        errors = {row["error"] for row in w.failed}
        if len(errors) == 1:
            raise JobAbortedError(
                f"the first {FAIL_FAST_RECORDS} records all failed with: {errors.pop()}; "
                "stopped so the rest of the job is not spent the same way"
            )
