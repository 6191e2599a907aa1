"""Rows for the records the plan found to repeat another's prompt (``scheduling.dedup``).

A copy is never fed to the engine. When its original's answer becomes a row, every copy of
it gets the same row under its own id and kept columns, marked ``answered_from``; a failed
original fails its copies with the same error. The copies are held with the original's row
and so checkpoint in the same chunk: a resume finds both done or neither, and a copy is
never lost or answered twice. Copies live in their original's shard (the plan puts them
there), so the shard commit stays exactly-once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from nightshift.io.planstore import PlanStore
from nightshift.jobs.columns import kept_rows
from nightshift.scheduling.dedup import ANSWERED_FROM

_SENT = ("prompt_tokens", "output_tokens", "cached_tokens")


class CopyBook:
    """The plan's copies: shard -> original id -> its copies' ids."""

    def __init__(self, plans: PlanStore, by_shard: dict[int, dict[Any, list]]) -> None:
        self.plans, self.by_shard = plans, by_shard

    @classmethod
    def load(cls, plans: PlanStore, manifest: dict[str, Any]) -> CopyBook:
        files = manifest.get("records_files", ["plan/records.parquet"])
        if not _may_have_copies(manifest):
            return cls(plans, {})  # no copies (or a plan from before dedup): read nothing
        columns = {c: plans.read_column(files, c) for c in ("shard", "record_id", ANSWERED_FROM)}
        frame = pl.from_arrow(pa.table(columns)).filter(pl.col(ANSWERED_FROM).is_not_null())
        by_shard: dict[int, dict[Any, list]] = defaultdict(lambda: defaultdict(list))
        for shard, copy, original in frame.iter_rows():
            by_shard[shard][original].append(copy)
        return cls(plans, by_shard)

    def ids(self, shard: int) -> set:
        """Every copy id of ``shard``: the feed leaves them out."""
        return {c for copies in self.by_shard.get(shard, {}).values() for c in copies}

    def for_shard(
        self, shard: int, id_column: str, keep: list[str], done: set
    ) -> dict[Any, list[tuple[Any, dict]]]:
        """Original id -> (copy id, kept columns) of ``shard``'s copies not yet done."""
        mine = self.by_shard.get(shard)
        if not mine:
            return {}
        kept = self._kept(shard, id_column, keep)
        return {
            original: [(c, kept.get(c, {})) for c in copies if c not in done]
            for original, copies in mine.items()
        }

    def _kept(self, shard: int, id_column: str, keep: list[str]) -> dict[Any, dict]:
        """Each copy's kept columns, from the shard's plan: only the columns wanted, the
        copies picked out by Arrow (a Python test per record was 2.5 µs of every record,
        on the thread that feeds the engine)."""
        if not keep:
            return {}
        wanted, kept = self.ids(shard), {}
        columns = list(dict.fromkeys([id_column, *keep]))
        for batch in self.plans.shard_batches(shard, 65_536, columns=columns):
            records = pa.Table.from_batches([batch])
            records = records.filter(_among(records.column(id_column), wanted))
            for record_id, row in zip(
                records.column(id_column).to_pylist(), kept_rows(records, keep), strict=True
            ):
                kept[record_id] = row
        return kept


def _among(ids: pa.ChunkedArray, wanted: set) -> pa.ChunkedArray | pa.Array:
    """Which of ``ids`` are in ``wanted``: by Arrow where the ids take its values' type,
    else one set lookup each."""
    try:
        return pc.is_in(ids, value_set=pa.array(list(wanted)).cast(ids.type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return pa.array([i in wanted for i in ids.to_pylist()], pa.bool_())


def _may_have_copies(manifest: dict[str, Any]) -> bool:
    """Whether plan.json counts copies. An increment planned before increments counted
    their own repeats (no ``repeats`` entry) may hold copies the total left out."""
    if manifest.get("repeats", {}).get("copies"):
        return True
    return any("repeats" not in i for i in manifest.get("increments", [])[1:])


def copy_rows(
    copies: dict[Any, list[tuple[Any, dict]]],
    original: Any,
    row: dict,
    id_column: str,
    saved: Counter,
) -> list[dict]:
    """The rows of ``original``'s copies, from its row; taken once (never answered twice).
    A copy's token counts are 0, what it cost the engine; ``saved`` adds what it saved."""
    rows = [
        {**not_sent(row), **kept, id_column: copy, ANSWERED_FROM: original}
        for copy, kept in copies.pop(original, [])
    ]
    if rows:
        saved["rows"] += len(rows)
        saved["prompt_tokens_not_sent"] += len(rows) * (row.get("prompt_tokens") or 0)
        saved["output_tokens_not_generated"] += len(rows) * (row.get("output_tokens") or 0)
    return rows


def not_sent(row: dict) -> dict:
    """A row as the run's totals count it when no tokens went to the engine for it."""
    sent = _SENT + (("reasoning_tokens",) if "reasoning_tokens" in row else ())  # thinking
    return {**row, **dict.fromkeys(sent, 0)}
