"""One shard in progress, and what its commit marker says about it.

A shard's answers come back in any order; it keeps them in memory (``ok``, ``failed``)
until they are checkpointed as a chunk (``files``), and at its last record merges the
chunks and what it holds into one row per record (``MergedShard``), whose ok rows its
commit writes a chunk at a time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nightshift.engines.reasoning import REASONING_LENGTH
from nightshift.errors import NightshiftError
from nightshift.io.shardstore import ShardStore, StoredFile, TableParts, one_row_per_record
from nightshift.running.results import ResultTables


@dataclass
class ShardWork:
    """One shard in progress: its checkpointed chunks and the answers held since."""

    shard: int
    planned: int
    files: list[StoredFile]
    done_ids: set = field(default_factory=set)
    ok: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)
    chunks: int = 0
    answered_now: int = 0  # by the current engine: an engine that dies costs these an attempt
    copies: dict = field(default_factory=dict)  # dedup: original id -> copies not yet done
    skip: set = field(default_factory=set)  # ids the feed leaves out: done, and copies

    @property
    def held(self) -> int:
        return len(self.ok) + len(self.failed)

    @property
    def remaining(self) -> int:
        return self.planned - len(self.done_ids) - self.held

    def merged(self, shards: ShardStore, tables: ResultTables, id_column: str) -> MergedShard:
        """Its checkpointed chunks and the answers it holds, one row per record, checked
        to add up to the records planned. The ok rows are read twice, never held whole:
        first their keys (``SUMMED``), then, as the commit writes them, a chunk at a time
        (a shard of 100,000 576-float embeddings was 250 MB held at its commit)."""
        sources = [lambda f=f: shards.read([f], "ok")[0] for f in self.files if f.kind == "ok"]
        sources.append(lambda held=tables.results_table(self.ok): held)
        at = "_at" if id_column != "_at" else "__at"  # where a row is: part << 32 | row
        keys = []
        for part, source in enumerate(sources):
            table = source()
            small = table.select([c for c in (id_column, *SUMMED) if c in table.column_names])
            # copied out: a chunk's columns are views of its bytes, vectors and all
            small = small.take(pa.array(np.arange(table.num_rows)))
            where = (np.int64(part) << 32) + np.arange(table.num_rows, dtype=np.int64)
            keys.append(small.append_column(at, pa.array(where)))
        ok = pa.concat_tables(keys)
        failed = pa.concat_tables(
            shards.read(self.files, "failed") + [tables.failed_table(self.failed)]
        )
        # Two attempts that ran the shard at once both checkpointed some of its records.
        ok, failed = one_row_per_record(ok, failed, id_column)
        if ok.num_rows + failed.num_rows != self.planned:
            raise NightshiftError(
                f"shard {self.shard} does not reconcile: {self.planned} planned, "
                f"{ok.num_rows} ok + {failed.num_rows} failed; nothing was committed and "
                "its checkpoints are kept"
            )
        return MergedShard(ok, failed, sources, at)


# The ok columns a commit reads before it writes: the id (one row per record) and what
# its marker sums (``shard_summary``).
SUMMED = ("prompt_tokens", "cached_tokens", "output_tokens", "finish_reason", "reasoning_tokens")


@dataclass
class MergedShard:
    """A shard's rows, one per record: its ok rows' keys (``ok``: the id, ``SUMMED`` and
    ``at``), its failed rows whole (few and small), and the ok rows themselves, read
    again a part at a time as they are written (``ok_parts``)."""

    ok: pa.Table
    failed: pa.Table
    sources: list[Callable[[], pa.Table]]
    at: str  # the column of ``ok`` saying where each row is (part << 32 | row)

    def ok_parts(self) -> TableParts:
        where = np.sort(self.ok.column(self.at).to_numpy())  # by part, then row
        bounds = np.searchsorted(where >> 32, np.arange(len(self.sources) + 1))

        def parts() -> Iterator[pa.Table]:
            for part, source in enumerate(self.sources):
                table = source()
                wanted = where[bounds[part] : bounds[part + 1]] & 0xFFFFFFFF
                if len(wanted) != table.num_rows:  # another attempt's rows came first
                    table = table.take(pa.array(wanted))
                yield table
                table = None  # not held while the next is read

        return TableParts(self.ok.num_rows, parts)


def add_reasoning(summary: dict[str, Any], ok: pa.Table, failed: pa.Table) -> None:
    """A reasoning model's shard: its thinking tokens (of the output tokens), and the
    records that thought until no token was left (failed as ``reasoning_length``)."""
    summary["tokens"]["reasoning"] = sum(
        pc.sum(t.column("reasoning_tokens")).as_py() or 0 for t in (ok, failed)
    )
    errors = pc.starts_with(failed.column("error"), pattern=f"{REASONING_LENGTH}:")
    summary["records"][REASONING_LENGTH] = pc.sum(errors).as_py() or 0


def shard_summary(ok: pa.Table, failed: pa.Table, planned: int, attempts: int) -> dict[str, Any]:
    """What a commit marker records about its shard, beside its files."""
    tokens = {
        name: sum(pc.sum(t.column(column)).as_py() or 0 for t in (ok, failed))
        for name, column in (
            ("prompt", "prompt_tokens"),
            ("prompt_cached", "cached_tokens"),
            ("output", "output_tokens"),
        )
    }
    reasons = Counter(
        ok.column("finish_reason").to_pylist() + failed.column("finish_reason").to_pylist()
    )
    reasons.pop(None, None)
    summary = {
        "records": {"planned": planned, "ok": ok.num_rows, "failed": failed.num_rows},
        "tokens": tokens,
        "finish_reasons": dict(sorted(reasons.items())),
        "attempts": attempts,
    }
    if "reasoning_tokens" in ok.column_names:  # model.reasoning: the thinking, counted apart
        add_reasoning(summary, ok, failed)
    return summary
