"""The plan's records as engine requests, in run order.

Records are read from the plan's shard files, rendered and encoded exactly as the plan
measured them (each with its own sampling, from ``input.sampling_column``), and handed
to the engine lazily; each record's shard, id and kept columns wait here until its
result comes back. Requests are keyed by a counter of the run, never
by a plan column: plan positions start again at 0 in every increment, so an old shard
and a new increment's shard in one feed would share keys (DESIGN invariant 8).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from nightshift.engines.base import EngineRequest, Sampling
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.io.planstore import PlanStore
from nightshift.jobs.columns import kept_rows
from nightshift.jobs.sampling import sampling_column
from nightshift.jobs.spec import JobSpec
from nightshift.memory import give_back_now_and_then
from nightshift.running.encoding import LocalEncoding, ProcessEncoding, close_spare
from nightshift.running.prefetch import DONE, EMPTY, Prefetch

REQUEST_BATCH = 256  # records rendered and encoded together, ahead of the engine
READ_ROWS = 8192  # plan rows read at once, cut into request batches
# Batches encoded ahead. More only adds a thread competing with a CPU engine for cores
# (measured: 32 ahead was slower than 4 on the 2-core machine); on a GPU it is idle CPU.
AHEAD_BATCHES = 4
# Times a request whose error is transient (vLLM's "error" finish) is sent again before
# it becomes a failed row.
TRANSIENT_RETRIES = 2


END = object()  # ``next_request``: the feed has nothing more, ever


@dataclass(frozen=True)
class ShardEnd:
    """In the encoded stream: every record of ``shard`` came before this."""

    shard: int


@dataclass
class Pending:
    """A request sent and not yet answered: whose it is, and enough to send it again."""

    shard: int
    record_id: Any
    kept: dict[str, Any]
    token_ids: Sequence[int]
    tries: int = 1
    sampling: Sampling | None = None  # its own (input.sampling_column); None: the run's
    adapter: str | None = None  # its adapter (input.adapter_column); None: the base model


class RequestFeed:
    """The plan's records as engine requests, in run order, remembering each one's shard,
    id and kept columns until its result comes back.

    ``keys`` numbers the requests; a runner that builds several feeds passes one counter
    to all, so that a late result of an earlier feed can never match a later request."""

    def __init__(
        self,
        spec: JobSpec,
        store: PlanStore,
        encoder: PromptEncoder,
        keys: Iterator[int] | None = None,
        keep: list[str] | None = None,
        sampling: Sampling | None = None,
        processes: int = 0,
    ) -> None:
        self.spec, self.store, self.encoder = spec, store, encoder
        self.processes = processes  # encoding processes (running.encoding); 0: a thread
        self._encoding: LocalEncoding | ProcessEncoding | None = None
        # the columns copied into results: the runner's (input.keep_columns + eval's)
        self.id_column = spec.input.id_column
        self.keep = keep if keep is not None else spec.input.keep_columns
        # per-record sampling over the run's ``sampling`` (a scored classify step), or None
        self.sampling = sampling_column(spec, sampling)
        self.adapter_column = spec.input.adapter_column  # per-record adapter, or None
        self.in_flight: dict[int, Pending] = {}
        self._keys = keys if keys is not None else itertools.count()
        self._again: deque[EngineRequest] = deque()
        self._prefetch: Prefetch | None = None
        self._inbox: queue.SimpleQueue[tuple[int, set] | None] = queue.SimpleQueue()
        self._input_closed = self._ended = False
        self._ready: deque[EngineRequest] = deque()  # a batch being handed out
        self._pending: Counter = Counter()  # shard -> its requests not yet come back
        # The prefetch thread adds to ``_pending`` while the feeding thread takes answers
        # off it: a read-modify-write each, which a thread switch between the read and
        # the write would lose (a shard then ends its attempt early, or never).
        self._pending_lock = threading.Lock()
        self._fed: set[int] = set()  # shards whose every record was handed out
        self._newly_fed: list[int] = []

    def add(self, shard: int, skip: set | None = None) -> None:
        """Feed ``shard`` after the shards added before it, leaving out the ids in
        ``skip`` (records it already checkpointed). Encoding runs ahead in a thread (the
        tokenizer releases the GIL) from the first ``add``: a feed built before the
        engine is up has its first batches ready when it is."""
        if self._prefetch is None:
            if self.processes:
                self._encoding = ProcessEncoding(self.spec, self.encoder, self.processes)
            else:
                close_spare(self.spec)  # started for the input's size; the plan's is small
                self._encoding = LocalEncoding(self.spec, self.encoder)
            self._prefetch = Prefetch(self._batches(), depth=AHEAD_BATCHES)
        self._inbox.put((shard, skip or set()))

    def close_input(self) -> None:
        """No more shards will be added: ``next_request`` ends after the last one's."""
        if not self._input_closed:
            self._input_closed = True
            self._inbox.put(None)

    def next_request(self, wait: float | None = 0) -> EngineRequest | None | object:
        """The next request to send: a retry first, then the shards' records in the order
        added; None when nothing is ready within ``wait`` seconds; ``END`` when the input
        is closed, every shard's records were handed out and no retry waits."""
        while True:
            if (request := self.ready_request()) is not None:
                return request
            if self._prefetch is None or self._ended:
                return END if self._input_closed else None
            item = self._prefetch.poll(wait)
            if item is EMPTY:
                return None
            if item is DONE:
                self._ended = True
            elif isinstance(item, ShardEnd):
                self._fed.add(item.shard)
                self._newly_fed.append(item.shard)
            else:
                self._ready.extend(item)

    def ready_request(self) -> EngineRequest | None:
        """A request at hand, a retry first, then the rest of the batch being handed out;
        None when there is none (without waiting, or looking at the encoding)."""
        if self._again:
            return self._again.popleft()
        if self._ready:
            return self._ready.popleft()
        return None

    def requests(self, shards: list[int], skip: dict[int, set] | None = None):
        """All requests of ``shards`` in plan order, waiting for each (for callers that
        want the plan's prompts as a plain stream)."""
        for shard in shards:
            self.add(shard, (skip or {}).get(shard))
        self.close_input()
        while (request := self.next_request(wait=None)) is not END:
            if request is not None:
                yield request

    def newly_fed(self) -> list[int]:
        """Shards whose every record was handed out since the last call."""
        shards, self._newly_fed = self._newly_fed, []
        return shards

    def stuck(self, shard: int) -> bool:
        """Every request of ``shard`` was handed out and came back, answered or not."""
        if shard not in self._fed:  # added to by the feeding thread, the one asking
            return False
        with self._pending_lock:
            return not self._pending[shard]

    @property
    def retrying(self) -> bool:
        """Whether requests wait to be sent again."""
        return bool(self._again)

    def close(self) -> None:
        """Stop the encoding thread; the shard copies it held open are removed."""
        self.close_input()
        if self._prefetch is not None:
            self._prefetch.close()
        if self._encoding is not None:
            self._encoding.close()

    def _batches(self) -> Iterator[list[EngineRequest] | ShardEnd]:
        """Batches of requests and shard ends, in order; with encoding processes, up to
        two batches a process are being encoded while the oldest is handed out."""
        sent: deque = deque()  # ShardEnd, or (shard, records, their ids once encoded)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:  # all that was sent goes to the engine before waiting
                while sent:
                    yield self._handed(sent.popleft())
                item = self._inbox.get()
            if item is None:
                break
            shard, done = item
            for records in self._shard_records(shard, done):
                sent.append((shard, records, self._encoding.submit(records)))
                while len(sent) > 2 * self.processes:
                    yield self._handed(sent.popleft())
            sent.append(ShardEnd(shard))
        while sent:
            yield self._handed(sent.popleft())

    def _shard_records(self, shard: int, done: set) -> Iterator[pa.Table]:
        """``shard``'s records not in ``done``, ``REQUEST_BATCH`` at a time, as Arrow
        (what a child is sent, and what the requests are made from: no polars here). The
        plan is read and filtered ``READ_ROWS`` at a time: per request batch, each of
        those cost more than the encoding (``run_path.py``)."""
        left_out = pa.array(list(done)) if done else None
        for batch in self.store.shard_batches(shard, READ_ROWS):
            table = pa.Table.from_batches([batch])
            if left_out is not None:
                ids = table.column(self.id_column)
                table = table.filter(pc.invert(pc.is_in(ids, left_out.cast(ids.type))))
            give_back_now_and_then()  # what this thread freed (Arrow keeps it per thread)
            for at in range(0, table.num_rows, REQUEST_BATCH):
                yield table.slice(at, REQUEST_BATCH)

    def _handed(self, item) -> list[EngineRequest] | ShardEnd:
        if isinstance(item, ShardEnd):
            return item
        shard, records, encoded = item
        return self._requests(shard, records, encoded())

    def _requests(
        self, shard: int, records: pa.Table, token_ids: list[list[int]]
    ) -> list[EngineRequest]:
        # under their results' names: a kept `text` is input_text (jobs.columns.kept_name)
        kept = kept_rows(records, self.keep) if self.keep else [{}] * records.num_rows
        ids = records.column(self.id_column).to_pylist()
        samplings = self._samplings(records)
        adapters = self._adapters(records)
        with self._pending_lock:  # counted before any of them can come back, at once
            self._pending[shard] += len(ids)
        requests = []
        for record_id, row, tokens, sampling, adapter in zip(
            ids, kept, token_ids, samplings, adapters, strict=True
        ):
            key = next(self._keys)
            self.in_flight[key] = Pending(shard, record_id, row, tokens, 1, sampling, adapter)
            requests.append(EngineRequest(key, tokens, sampling, adapter))
        return requests

    def _adapters(self, records: pa.Table) -> list[str | None]:
        """Each record's adapter (the plan rejected every unknown name)."""
        if self.adapter_column is None:
            return [None] * records.num_rows
        return records.column(self.adapter_column).to_pylist()

    def _samplings(self, records: pa.Table) -> list[Sampling | None]:
        """Each record's own merged sampling (None each without a sampling column). The
        plan rejected every value that does not parse, so each one here does."""
        if self.sampling is None:
            return [None] * records.num_rows
        values = records.column(self.sampling.column).to_pylist()
        return [self.sampling.sampling(v) for v in values]

    def answered(self, key: int) -> Pending:
        """The record whose result has come back under ``key``."""
        pending = self.in_flight.pop(key)
        with self._pending_lock:
            self._pending[pending.shard] -= 1
        return pending

    def retry(self, key: int) -> bool:
        """Send the request of ``key`` again under a new key, unless it has been sent
        ``TRANSIENT_RETRIES`` times more already; True when it was queued."""
        pending = self.in_flight[key]
        if pending.tries > TRANSIENT_RETRIES:
            return False
        del self.in_flight[key]
        pending.tries += 1
        again = next(self._keys)
        self.in_flight[again] = pending
        self._again.append(
            EngineRequest(again, pending.token_ids, pending.sampling, pending.adapter)
        )
        return True
