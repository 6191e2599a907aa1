"""The plan's records as engine requests, in run order.

Records are read from the plan's shard files, rendered and encoded exactly as the plan
measured them, and handed to the engine lazily; each record's shard, id and kept columns
wait here until its result comes back. Requests are keyed by a counter of the run, never
by a plan column: plan positions start again at 0 in every increment, so an old shard
and a new increment's shard in one feed would share keys (DESIGN invariant 8).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from nightshift.engines.base import EngineRequest
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.io.planstore import PlanStore
from nightshift.jobs.spec import JobSpec
from nightshift.running.prefetch import Prefetch
from nightshift.scheduling.prompts import PromptTemplate

REQUEST_BATCH = 256  # records rendered and encoded together, ahead of the engine
# Batches encoded ahead. More only adds a thread competing with a CPU engine for cores
# (measured: 32 ahead was slower than 4 on the 2-core machine); on a GPU it is idle CPU.
AHEAD_BATCHES = 4
# Times a request whose error is transient (vLLM's "error" finish) is sent again before
# it becomes a failed row.
TRANSIENT_RETRIES = 2


@dataclass
class Pending:
    """A request sent and not yet answered: whose it is, and enough to send it again."""

    shard: int
    record_id: Any
    kept: dict[str, Any]
    token_ids: Sequence[int]
    tries: int = 1


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
    ) -> None:
        self.template = PromptTemplate(spec.prompt.template, spec.prompt.system)
        self.store, self.encoder = store, encoder
        self.id_column, self.keep = spec.input.id_column, spec.input.keep_columns
        self.in_flight: dict[int, Pending] = {}
        self._keys = keys if keys is not None else itertools.count()
        self._again: deque[EngineRequest] = deque()
        self._prefetch: Prefetch | None = None

    def requests(
        self, shards: list[int], skip: dict[int, set] | None = None
    ) -> Iterator[EngineRequest]:
        """Requests for ``shards`` in plan order, leaving out ids in ``skip[shard]``
        (records a shard already checkpointed), with requests to send again
        (``retry``) slipped in as they come."""
        # Rendering and encoding run ahead in a thread (the tokenizer releases the GIL),
        # starting now: build the feed before the engine and start-up hides the first
        # batches' encoding. ``close`` stops it, also when the engine never started.
        self._prefetch = Prefetch(self._batches(shards, skip or {}), depth=AHEAD_BATCHES)
        return self._stream(self._prefetch)

    def _stream(self, batches: Iterator[list[EngineRequest]]) -> Iterator[EngineRequest]:
        for batch in batches:
            for request in batch:
                yield from self.again()
                yield request
        yield from self.again()

    def again(self) -> Iterator[EngineRequest]:
        """The requests ``retry`` queued and not yet sent (empty when there are none)."""
        while self._again:
            yield self._again.popleft()

    @property
    def retrying(self) -> bool:
        """Whether requests wait to be sent again."""
        return bool(self._again)

    def close(self) -> None:
        """Stop the encoding thread; the shard copies it held open are removed."""
        if self._prefetch is not None:
            self._prefetch.close()

    def _batches(self, shards: list[int], skip: dict[int, set]) -> Iterator[list[EngineRequest]]:
        for shard in shards:
            done = skip.get(shard)
            for batch in self.store.shard_batches(shard, REQUEST_BATCH):
                records = pl.from_arrow(pa.Table.from_batches([batch]))
                if done:
                    records = records.filter(~pl.col(self.id_column).is_in(list(done)))
                if records.height:
                    yield self._encode(shard, records)

    def _encode(self, shard: int, records: pl.DataFrame) -> list[EngineRequest]:
        segments = [s.to_list() for s in self.template.segment_texts(records)]
        token_ids = self.encoder.encode_records(
            self.template.system, self.template.head, list(zip(*segments, strict=True))
        )
        kept = records.select(self.keep).to_dicts() if self.keep else [{}] * records.height
        ids = records[self.id_column].to_list()
        requests = []
        for record_id, row, tokens in zip(ids, kept, token_ids, strict=True):
            key = next(self._keys)
            self.in_flight[key] = Pending(shard, record_id, row, tokens)
            requests.append(EngineRequest(key, tokens))
        return requests

    def answered(self, key: int) -> Pending:
        """The record whose result has come back under ``key``."""
        return self.in_flight.pop(key)

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
        self._again.append(EngineRequest(again, pending.token_ids))
        return True
