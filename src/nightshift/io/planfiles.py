"""A plan's files made from its keys: each shard's input columns in run order, and the
rejects' (see ``io.planstore`` for the layout).

Each shard's input is copied out of the input files once, so a run reads one shard file
per shard instead of scanning every input file for its records, and the shard's
membership can never change under a running job. The copy is a second streaming pass:
each input file's records are routed to per-shard pieces, then each shard's pieces are
sorted into run order; memory holds one input batch or one shard at a time.

The input's columns never share a frame with the plan's keys (``_file``, ``_row``,
``position``, ``shard``, ...): records are picked out of input batches by row number, so
any input column name works (DESIGN invariant 8).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from nightshift.errors import InputError
from nightshift.io.inputs import READ_BATCH, file_batches
from nightshift.io.shardstore import shard_name
from nightshift.memory import give_back_freed

REJECTS = "rejects.parquet"
# A shard file's one column of nightshift's own, after the input's columns: each record's
# place in the plan's run order. The one input column name a job may not use
# (``scheduling.plan.open_job_input`` says so); every other name works.
POSITION = "__nightshift_position__"
# Rows in each row group of a shard file. A Parquet reader decodes a whole row group at
# once, whatever batch size it is asked for: as one group (polars' default holds 262,144
# rows), a shard of 128,000 tickets held 74 MB decoded for as long as the feed read it.
SHARD_ROW_GROUP = 8192


class Plan(Protocol):
    """What the store needs of a plan (``scheduling.plan.Plan`` is one)."""

    dataset: ds.FileSystemDataset  # the input files, in the order _file numbers them
    columns: list[str]
    records: pl.DataFrame  # _file, _row, position, shard, ...
    rejects: pl.DataFrame  # _file, _row, reason, reject_kind, ...

    @property
    def input_schema(self) -> pa.Schema: ...

    @property
    def shards(self) -> list[int]: ...


class PlanFiles:
    """What a plan's files are made from its fields: the input columns' schema, and its
    shard numbers (``scheduling.plan.Plan`` and ``KeptPlan`` are both)."""

    dataset: ds.FileSystemDataset
    columns: list[str]
    records: pl.DataFrame

    @property
    def input_schema(self) -> pa.Schema:
        return pa.schema([self.dataset.schema.field(c) for c in self.columns])

    @property
    def shards(self) -> list[int]:
        """The shard numbers this plan cuts (an increment's start after earlier plans')."""
        return self.records["shard"].unique().sort().to_list()


def shard_file(shard: int) -> str:
    """A shard's input file, relative to the plan directory."""
    return f"shards/{shard_name(shard)}.parquet"


def reject_column_names(columns: list[str]) -> tuple[str, str]:
    """rejects.parquet's own columns, ``reason`` and ``reject_kind``, beside the input
    columns ``columns``. Where the job uses an input column of that name, the input column
    keeps it and nightshift's takes a ``nightshift_`` prefix (``_`` added until it is free),
    so no input column is ever overwritten or dropped."""
    names = []
    for name in ("reason", "reject_kind"):
        if name in columns:
            name = f"nightshift_{name}"
        while name in columns:
            name = f"_{name}"
        names.append(name)
    return names[0], names[1]


def copy_shard_inputs(
    plan: Plan, root: Path, shards: list[int], put: Callable[[int, Path], None]
) -> None:
    """The input columns of each of ``shards`` in run order, each given to ``put`` once
    written, and the rejects' in input order. The input's frames never take a plan
    column: records are picked by row number, so every input column name works,
    ``position``, ``shard`` and ``_row`` included."""
    pieces = root / ".pieces"
    targets = plan.records.select("_file", "_row", "shard")
    if len(shards) < len(plan.shards):  # the others are stored already
        targets = targets.filter(pl.col("shard").is_in(shards))
    held = plan.rejects.select("_file", "_row")
    for index in range(len(plan.dataset.files)):
        _route_file(plan, index, targets, held, pieces)
    # each shard's keys, split once (a filter a shard read every record once a shard)
    keys = plan.records.select("shard", "_file", "_row", "position", "record_id")
    by_shard = keys.partition_by("shard", as_dict=True, include_key=False)
    for shard in shards:
        found = sorted((pieces / f"{shard:05d}").glob("*.parquet"))
        _write_shard(by_shard[(shard,)], plan.columns[0], found, root / shard_file(shard))
        put(shard, root / shard_file(shard))
        give_back_freed()  # memory holds one shard at a time
    _write_rejects(plan, sorted((pieces / "rejects").glob("*.parquet")), root)
    shutil.rmtree(pieces, ignore_errors=True)


def _route_file(
    plan: Plan, index: int, targets: pl.DataFrame, held: pl.DataFrame, pieces: Path
) -> None:
    """Send each record of input file ``index`` to its shard's pieces, or to rejects.
    Pieces keep input row order, so a shard's pieces read back in (file, row) order."""
    mine = targets.filter(pl.col("_file") == index).sort("_row")
    aside = held.filter(pl.col("_file") == index).sort("_row")
    row = 0
    for batch_no, batch in enumerate(file_batches(plan.dataset, index, plan.columns, READ_BATCH)):
        frame = pl.from_arrow(pa.Table.from_batches([batch]))
        end, name = row + batch.num_rows, f"{index:05d}-{batch_no:05d}.parquet"
        here = _rows_between(mine, row, end)
        local = here.select((pl.col("_row") - row).alias("i"), "shard")
        for (shard,), part in local.partition_by("shard", as_dict=True).items():
            _write_piece(frame[part["i"]], pieces / f"{shard:05d}" / name)
        set_aside = _rows_between(aside, row, end)["_row"] - row
        if set_aside.len():
            _write_piece(frame[set_aside], pieces / "rejects" / name)
        row = end


def _rows_between(keys: pl.DataFrame, start: int, end: int) -> pl.DataFrame:
    """The rows of ``keys`` (sorted by ``_row``) whose ``_row`` is in [start, end)."""
    lo, hi = keys["_row"].search_sorted(pl.Series([start, end], dtype=pl.UInt32)).to_list()
    return keys.slice(lo, hi - lo)


def _write_piece(frame: pl.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path)


def _write_shard(keys: pl.DataFrame, id_column: str, found: list[Path], path: Path) -> None:
    """A shard's input columns in run order, and its records' plan positions (``keys``:
    the shard's ``_file``, ``_row``, ``position`` and ``record_id``). Refused where the
    rows found there are not the records planned: an input file changed since."""
    positions = keys.sort("_file", "_row")["position"]  # the pieces' order
    frame = pl.read_parquet(found) if found else pl.DataFrame()
    if frame.height == keys.height:
        frame = frame[positions.arg_sort()]
    planned = keys.sort("position")["record_id"]
    if frame.height != keys.height or not frame[id_column].equals(
        planned, check_names=False, check_dtypes=False
    ):
        raise InputError(
            "input.path: an input file no longer holds the records its plan was made "
            "from (it changed while the plan was written); run the job again"
        )
    frame = frame.with_columns(positions.sort().alias(POSITION))
    frame.write_parquet(path, row_group_size=SHARD_ROW_GROUP)


def _write_rejects(plan: Plan, found: list[Path], root: Path) -> None:
    """All rejects in input order, with the input columns the job used, then their reason
    and kind (under the names ``reject_column_names`` gives)."""
    reason, kind = reject_column_names(plan.columns)
    schema = pa.schema(
        list(plan.input_schema) + [pa.field(reason, pa.string()), pa.field(kind, pa.string())]
    )
    if not found:
        pq.write_table(schema.empty_table(), root / REJECTS)
        return
    why = plan.rejects.sort("_file", "_row").select(
        pl.col("reason").alias(reason), pl.col("reject_kind").alias(kind)
    )
    table = pl.concat([pl.read_parquet(found), why], how="horizontal").to_arrow()
    pq.write_table(table.select(schema.names).cast(schema), root / REJECTS)
