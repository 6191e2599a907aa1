"""The plan on disk, next to the output, written before any generation starts.

Layout (the output may be a local directory or an S3 prefix)::

    OUTPUT/plan/records.parquet          every runnable record in run order: position,
                                         shard, record_id, file and row, tokens
    OUTPUT/plan/shards/shard-00000.parquet  a shard's input columns, in run order, and
                                         POSITION (each record's place in that order)
    OUTPUT/rejects.parquet               records that cannot run: input columns, reason,
                                         reject_kind (see ``reject_column_names``)
    OUTPUT/plan/plan.json                counts, shards, predicted prefix reuse, the
                                         input schema and the spec's fingerprint;
                                         written last: no plan.json, no plan
    OUTPUT/plan/built.json               while the files are written: the plan.json to
                                         be, once records.parquet and
                                         built-rejects.parquet (the rejects' keys) are
                                         stored, so a run stopped while it wrote the
                                         shard files writes the rest (``PlanStore.kept``)
                                         instead of planning again; gone with plan.json
    OUTPUT/plan/calibration.json         classify: the model's leaning toward each
                                         label, measured once before the first answer
                                         (``running.calibration``); first writer wins
    OUTPUT/plan/canary.json              the canary's agreement with the reference
                                         (``pipelines.canary``); first writer wins
    OUTPUT/canary/                       the canary's sample runs (reference/, job/) and
                                         the job's answers to its sample (cache/)

A later run that finds new records in the input adds an increment (``scheduling.increments``):
its shards are numbered after the earlier ones, its keys go to
``plan/records-0001.parquet`` and ``rejects-0001.parquet``, and plan.json, rewritten
last, adds up all increments.

A first plan's keys are stored before its shard files (``built.json`` says so), and
each shard file is stored as soon as it is written: planning a million records takes
half a minute, and a run killed while writing the files keeps that work.

Each shard's input is copied out of the input files once (``io.planfiles``).
"""

from __future__ import annotations

import base64
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from polars.exceptions import PolarsError

from nightshift.errors import ObjectNotFound, OutputExistsError
from nightshift.faults import crash_point
from nightshift.io.objectstore import ObjectStore
from nightshift.io.planfiles import (
    POSITION,
    REJECTS,
    Plan,
    PlanFiles,
    copy_shard_inputs,
    reject_column_names,
    shard_file,
)

__all__ = ["POSITION", "REJECTS", "PlanFiles", "PlanStore", "reject_column_names"]

PLAN_DIR = "plan"
MANIFEST = f"{PLAN_DIR}/plan.json"
CALIBRATION = f"{PLAN_DIR}/calibration.json"
CANARY = f"{PLAN_DIR}/canary.json"
CANARY_DIR = "canary"  # the canary's two sample runs and the answers the job keeps
BUILT = f"{PLAN_DIR}/built.json"
BUILT_REJECTS = f"{PLAN_DIR}/built-rejects.parquet"
SHARDS_DIR = f"{PLAN_DIR}/shards/"
KEPT_RECORDS = {"shard", "position", "record_id", "_file", "_row"}  # what the files need
KEPT_REJECTS = {"_file", "_row", "reason", "reject_kind"}


@dataclass
class KeptPlan(PlanFiles):
    """A plan built by an earlier run (``PlanStore.kept``), over the input it was built
    from: written, it writes only the shard files that run did not."""

    dataset: ds.FileSystemDataset
    columns: list[str]
    records: pl.DataFrame
    rejects: pl.DataFrame


class PlanStore:
    """A job's plan in its output: ``write`` it once, then read shards from it."""

    POSITION = POSITION  # the column of a shard file that is not an input column

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def shard_key(shard: int) -> str:
        return f"{PLAN_DIR}/{shard_file(shard)}"

    def write(self, plan: Plan, manifest: dict[str, Any], increment: int = 0) -> str:
        """Write ``plan`` and its input copies, then ``manifest`` as plan.json, last. A
        first plan's keys are kept first (``kept``); a ``KeptPlan`` writes only the shard
        files its earlier run did not."""
        names = increment_files(increment)
        manifest = {
            "rejects_files": [names["rejects"]],
            "records_files": [names["records"]],
            **manifest,
            "input_schema": _encode_schema(plan.input_schema),
        }
        first = increment == 0
        if first and not isinstance(plan, KeptPlan):
            self._keep_built(plan, manifest, names["records"])
        stored = self._whole_shards(plan) if isinstance(plan, KeptPlan) else set()
        with tempfile.TemporaryDirectory(prefix="nightshift-plan-") as tmp:
            local = Path(tmp)
            (local / "shards").mkdir()
            todo = [s for s in plan.shards if s not in stored]
            copy_shard_inputs(plan, local, todo, self._put_shard)
            if not first:
                plan.records.write_parquet(local / "records.parquet")
                self.store.put_file(names["records"], local / "records.parquet")
            self.store.put_file(names["rejects"], local / REJECTS)
        crash_point("plan.before_manifest")
        self.store.put_bytes(MANIFEST, json.dumps(manifest, indent=2).encode())
        if first:
            self.store.delete([BUILT, BUILT_REJECTS])
        return self.store.uri(PLAN_DIR)

    def _keep_built(self, plan: Plan, manifest: dict[str, Any], records_key: str) -> None:
        """Store the plan's keys and its plan.json to be, built.json last. The files of
        another plan cut short here are deleted first: this plan writes its own shard
        files. Another run building this same plan (the same job over the same input
        files) writes the same files: those are left in place. A plan.json written here
        meanwhile (by another run) is never touched: this plan is refused."""
        if self.manifest() is not None:
            raise OutputExistsError(
                f"output.path: {self.store.uri('')} got a plan from another run while this "
                "one planned; rerun the same command to take that plan up"
            )
        if not self._built_here(manifest.get("fingerprint"), manifest.get("input_listing")):
            self.store.delete([BUILT, *self.store.list(SHARDS_DIR)])
        self.store.put_written(records_key, plan.records.write_parquet)
        self.store.put_written(BUILT_REJECTS, plan.rejects.write_parquet)
        self.store.put_bytes(BUILT, json.dumps(manifest, indent=2).encode())
        crash_point("plan.built")

    def _built_here(self, fingerprint: str | None, listing: str | None) -> dict[str, Any] | None:
        """built.json where it is that of the job ``fingerprint`` over the input files
        ``listing`` (``scheduling.increments.input_listing``), else None."""
        try:
            built = json.loads(self.store.get_bytes(BUILT))
        except (ObjectNotFound, ValueError):
            return None
        if listing is None or fingerprint is None or not isinstance(built, dict):
            return None
        same = built.get("input_listing") == listing and built.get("fingerprint") == fingerprint
        return built if same else None

    def _whole_shards(self, plan: KeptPlan) -> set[int]:
        """The shards of ``plan`` whose files an earlier run stored whole: a Parquet
        file of the shard's records, no fewer, no more (another is written again)."""
        stored = set(self.store.list(SHARDS_DIR))
        counts = dict(plan.records.group_by("shard").len().iter_rows())
        whole = set()
        for shard in plan.shards:
            if self.shard_key(shard) not in stored:
                continue
            try:
                footer = pq.read_metadata(BytesIO(self.store.get_bytes(self.shard_key(shard))))
            except (ObjectNotFound, OSError, pa.ArrowException):
                continue
            if footer.num_rows == counts[shard] and POSITION in footer.schema.names:
                whole.add(shard)
        return whole

    def unwrite(self) -> None:
        """Delete plan.json, for a plan that is to be replaced (``jobs plan --write``
        over a plan nothing ran): its files are then another plan's cut short."""
        self.store.delete([MANIFEST])

    def forget_built(self) -> None:
        """Delete built.json and its rejects' keys, left by a run killed after it wrote
        plan.json (which supersedes them): one delete, of nothing where none are."""
        self.store.delete([BUILT, BUILT_REJECTS])

    def _put_shard(self, shard: int, path: Path) -> None:
        self.store.put_file(self.shard_key(shard), path)
        path.unlink()
        crash_point("plan.shard_written")

    def kept(
        self, fingerprint: str, listing: str | None
    ) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]] | None:
        """The records, rejects and plan.json to be of a first plan an earlier run
        built here and was stopped while writing its files, where it was built for the
        same job (``fingerprint``) from the same input files (``listing``,
        ``scheduling.increments.input_listing``); else None, and the run plans afresh."""
        built = self._built_here(fingerprint, listing)
        if built is None:
            return None
        try:
            records = pl.read_parquet(BytesIO(self.store.get_bytes(built["records_files"][0])))
            rejects = pl.read_parquet(BytesIO(self.store.get_bytes(BUILT_REJECTS)))
            counted = (built["records"]["runnable"], built["records"]["rejected"])
        except (ObjectNotFound, KeyError, IndexError, TypeError, ValueError, OSError, PolarsError):
            return None  # not whole after all: planned afresh
        whole = set(records.columns) >= KEPT_RECORDS and set(rejects.columns) >= KEPT_REJECTS
        if not whole or (records.height, rejects.height) != counted:
            return None  # not what that plan wrote: planned afresh
        return records, rejects, built

    def manifest(self) -> dict[str, Any] | None:
        """The written plan's plan.json, or None when no plan was finished here."""
        try:
            return json.loads(self.store.get_bytes(MANIFEST))
        except ObjectNotFound:
            return None

    def calibration(self) -> dict[str, Any] | None:
        """The job's label calibration, or None when none was measured yet."""
        return self._kept(CALIBRATION)

    def keep_calibration(self, calibration: dict[str, Any]) -> dict[str, Any]:
        """Store ``calibration`` unless a worker stored one first; the one kept is
        returned, so every worker of a job labels by the same measure."""
        return self._keep(CALIBRATION, calibration)

    def canary(self) -> dict[str, Any] | None:
        """The job's canary (``pipelines.canary``), or None when none ran yet."""
        return self._kept(CANARY)

    def keep_canary(self, canary: dict[str, Any]) -> dict[str, Any]:
        """Store ``canary`` unless a run stored one first; the one kept is returned."""
        return self._keep(CANARY, canary)

    def replace_canary(self, canary: dict[str, Any]) -> dict[str, Any]:
        """Store ``canary`` over one kept to be measured again (``measure_again``)."""
        self.store.put_bytes(CANARY, json.dumps(canary, indent=2).encode())
        return canary

    def _kept(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.store.get_bytes(key))
        except ObjectNotFound:
            return None

    def _keep(self, key: str, data: dict[str, Any]) -> dict[str, Any]:
        """First writer wins: what is stored at ``key`` afterwards."""
        if self.store.put_if_absent(key, json.dumps(data, indent=2).encode()):
            return data
        return self._kept(key) or data

    def shard_batches(
        self, shard: int, rows: int, columns: list[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """``shard``'s planned records in run order, ``rows`` at a time (``columns``
        only, where given)."""
        with tempfile.TemporaryDirectory(prefix="nightshift-shard-") as tmp:
            path = self.store.download(self.shard_key(shard), Path(tmp) / "shard.parquet")
            yield from pq.ParquetFile(path).iter_batches(batch_size=rows, columns=columns)

    def read_records(self, columns: list[str]) -> pa.Table:
        """Those of ``columns`` the plan has, for every planned record (each increment's),
        in run order."""
        files = (self.manifest() or {}).get("records_files", [increment_files(0)["records"]])
        with tempfile.TemporaryDirectory(prefix="nightshift-plan-") as tmp:
            root = Path(tmp)
            paths = [self.store.download(k, root / f"{n}.parquet") for n, k in enumerate(files)]
            have = set(pq.read_schema(paths[0]).names)
            tables = [pq.read_table(p, columns=[c for c in columns if c in have]) for p in paths]
            return pa.concat_tables(tables, promote_options="permissive")

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


def input_schema(manifest: dict[str, Any]) -> pa.Schema:
    """The input columns' schema, as the plan stored it."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest["input_schema"])))


def _encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()
