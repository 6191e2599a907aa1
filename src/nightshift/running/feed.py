"""The plan's records as engine requests, in run order.

Records are read from the plan's shard files, rendered and encoded exactly as the plan
measured them, and handed to the engine lazily; each record's id and kept columns wait
here until its result comes back.
"""

from __future__ import annotations

from collections.abc import Iterator
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


class RequestFeed:
    """The plan's records as engine requests, in run order, remembering each one's shard,
    id and kept columns until its result comes back."""

    def __init__(self, spec: JobSpec, store: PlanStore, encoder: PromptEncoder) -> None:
        self.template = PromptTemplate(spec.prompt.template, spec.prompt.system)
        self.store, self.encoder = store, encoder
        self.id_column, self.keep = spec.input.id_column, spec.input.keep_columns
        self.in_flight: dict[int, tuple[int, Any, dict[str, Any]]] = {}

    def requests(
        self, shards: list[int], skip: dict[int, set] | None = None
    ) -> Iterator[EngineRequest]:
        """Requests for ``shards`` in plan order, leaving out ids in ``skip[shard]``
        (records a shard already checkpointed)."""
        # Rendering and encoding run ahead in a thread (the tokenizer releases the GIL),
        # starting now: build the feed before the engine and start-up hides the first
        # batches' encoding.
        batches = Prefetch(self._batches(shards, skip or {}), depth=AHEAD_BATCHES)
        return (request for batch in batches for request in batch)

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
        positions = records[PlanStore.POSITION].to_list()
        for position, record_id, row in zip(positions, ids, kept, strict=True):
            self.in_flight[position] = (shard, record_id, row)
        return [EngineRequest(p, t) for p, t in zip(positions, token_ids, strict=True)]

    def answered(self, key: int) -> tuple[int, Any, dict[str, Any]]:
        """The shard, id and kept columns of the record whose result has come back."""
        return self.in_flight.pop(key)
