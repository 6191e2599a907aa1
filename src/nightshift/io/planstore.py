"""The plan on disk, next to the output, written before any generation starts.

Layout (the output may be a local directory or an S3 prefix)::

    OUTPUT/plan/records.parquet          every runnable record in run order: position,
                                         shard, record_id, file and row, tokens
    OUTPUT/plan/shards/shard-00000.parquet  a shard's input columns, in run order
    OUTPUT/rejects.parquet               records that cannot run: input columns, reason
    OUTPUT/plan/plan.json                counts, shards, predicted prefix reuse, the
                                         input schema and the spec's fingerprint;
                                         written last: no plan.json, no plan

A later run that finds new records in the input adds an increment (``scheduling.increments``):
its shards are numbered after the earlier ones, its keys go to
``plan/records-0001.parquet`` and ``rejects-0001.parquet``, and plan.json, rewritten
last, adds up all increments.

Each shard's input is copied out of the input files once, so a run reads one shard file
per shard instead of scanning every input file for its records, and the shard's
membership can never change under a running job. The copy is a second streaming pass:
each input file's records are routed to per-shard pieces, then each shard's pieces are
sorted into run order; memory holds one input batch or one shard at a time.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from nightshift.errors import ObjectNotFound
from nightshift.faults import crash_point
from nightshift.io.inputs import READ_BATCH, file_batches
from nightshift.io.objectstore import ObjectStore
from nightshift.io.shardstore import shard_name


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

PLAN_DIR = "plan"
MANIFEST = f"{PLAN_DIR}/plan.json"
REJECTS = "rejects.parquet"


class PlanStore:
    """A job's plan in its output: ``write`` it once, then read shards from it."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def shard_key(shard: int) -> str:
        return f"{PLAN_DIR}/{_shard_file(shard)}"

    def write(self, plan: Plan, manifest: dict[str, Any], increment: int = 0) -> str:
        """Write ``plan`` and its input copies, then ``manifest`` as plan.json, last."""
        names = increment_files(increment)
        manifest = {
            "rejects_files": [names["rejects"]],
            "records_files": [names["records"]],
            **manifest,
            "input_schema": _encode_schema(plan.input_schema),
        }
        with tempfile.TemporaryDirectory(prefix="nightshift-plan-") as tmp:
            local = Path(tmp)
            (local / "shards").mkdir()
            plan.records.write_parquet(local / "records.parquet")
            _copy_shard_inputs(plan, local)
            for shard in plan.shards:
                self.store.put_file(self.shard_key(shard), local / _shard_file(shard))
            self.store.put_file(names["records"], local / "records.parquet")
            self.store.put_file(names["rejects"], local / REJECTS)
        crash_point("plan.before_manifest")
        self.store.put_bytes(MANIFEST, json.dumps(manifest, indent=2).encode())
        return self.store.uri(PLAN_DIR)

    def manifest(self) -> dict[str, Any] | None:
        """The written plan's plan.json, or None when no plan was finished here."""
        try:
            return json.loads(self.store.get_bytes(MANIFEST))
        except ObjectNotFound:
            return None

    def shard_batches(self, shard: int, rows: int) -> Iterator[pa.RecordBatch]:
        with tempfile.TemporaryDirectory(prefix="nightshift-shard-") as tmp:
            path = self.store.download(self.shard_key(shard), Path(tmp) / "shard.parquet")
            yield from pq.ParquetFile(path).iter_batches(batch_size=rows)

    def read_column(self, keys: list[str], column: str) -> pa.ChunkedArray:
        """One column of the plan's Parquet files ``keys``, concatenated."""
        with tempfile.TemporaryDirectory(prefix="nightshift-plan-") as tmp:
            paths = [self.store.download(k, Path(tmp) / f"{i}.parquet") for i, k in enumerate(keys)]
            tables = [pq.read_table(p, columns=[column]) for p in paths]
            return pa.concat_tables(tables, promote_options="permissive").column(0)


def increment_files(increment: int) -> dict[str, str]:
    """Where an increment's record keys and rejects go (the first keeps the plain names)."""
    if increment == 0:
        return {"records": f"{PLAN_DIR}/records.parquet", "rejects": REJECTS}
    return {
        "records": f"{PLAN_DIR}/records-{increment:04d}.parquet",
        "rejects": f"rejects-{increment:04d}.parquet",
    }


def _shard_file(shard: int) -> str:
    """A shard's input file, relative to the plan directory."""
    return f"shards/{shard_name(shard)}.parquet"


def input_schema(manifest: dict[str, Any]) -> pa.Schema:
    """The input columns' schema, as the plan stored it."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest["input_schema"])))


def _encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _copy_shard_inputs(plan: Plan, root: Path) -> None:
    pieces = root / ".pieces"
    targets = plan.records.select("_file", "_row", "position", "shard")
    rejects = plan.rejects.select("_file", "_row", "reason", "reject_kind")
    for index in range(len(plan.dataset.files)):
        _route_file(plan, index, targets, rejects, pieces)
    for shard in plan.shards:
        found = sorted((pieces / f"{shard:05d}").glob("*.parquet"))
        frame = pl.read_parquet(found).sort("position").drop("shard")
        frame.write_parquet(root / _shard_file(shard))
    _write_rejects(plan, sorted((pieces / "rejects").glob("*.parquet")), root)
    shutil.rmtree(pieces, ignore_errors=True)


def _route_file(
    plan: Plan, index: int, targets: pl.DataFrame, rejects: pl.DataFrame, pieces: Path
) -> None:
    """Send each record of input file ``index`` to its shard's pieces, or to rejects."""
    mine = targets.filter(pl.col("_file") == index).drop("_file")
    held = rejects.filter(pl.col("_file") == index).drop("_file")
    row = 0
    for batch_no, batch in enumerate(file_batches(plan.dataset, index, plan.columns, READ_BATCH)):
        frame = pl.from_arrow(pa.Table.from_batches([batch])).with_columns(
            pl.int_range(row, row + batch.num_rows, dtype=pl.UInt32).alias("_row")
        )
        row += batch.num_rows
        name = f"{index:05d}-{batch_no:05d}.parquet"
        routed = frame.join(mine, on="_row", how="inner").drop("_row")
        for (shard,), part in routed.partition_by("shard", as_dict=True).items():
            _write_piece(part, pieces / f"{shard:05d}" / name)
        set_aside = frame.join(held, on="_row", how="inner", maintain_order="left")
        if set_aside.height:
            _write_piece(set_aside, pieces / "rejects" / name)


def _write_piece(frame: pl.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path)


def _write_rejects(plan: Plan, found: list[Path], root: Path) -> None:
    """All rejects in input order, with the input columns the job used."""
    schema = pa.schema(
        list(plan.input_schema)
        + [pa.field("reason", pa.string()), pa.field("reject_kind", pa.string())]
    )
    if found:
        table = pl.read_parquet(found).drop("_row").to_arrow()  # pieces are in input order
        table = table.select(schema.names).cast(schema)
    else:
        table = schema.empty_table()
    pq.write_table(table, root / REJECTS)
