"""A batch job's answers in its records' line order, never all of them in memory at once.

The job answers in prefix order, shard by shard; the output files go in line order. A
dict of every answer would hold every vector as Python floats (about 75 bytes a
dimension: GBs for one large embeddings batch, inside the server), so the answers are
read twice instead:

1. Their ids only, to place each answer at its record's position (the records table is
   in line order) and keep one answer per record: a committed shard's, else a reject,
   else a checkpoint of a shard not yet committed (what a cancelled or expired batch
   answered), an ok row before a failed one, as a commit would keep them.
2. Their rows, spread by position into at most ``MAX_BUCKETS`` temporary Arrow files of
   consecutive positions; each bucket in turn is sorted and read back ``SLICE`` rows at
   a time. Memory holds one bucket's Arrow rows and one slice's Python objects.
"""

from __future__ import annotations

import heapq
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nightshift.batch.records import ID_COLUMN
from nightshift.batch.vectors import read_vectors
from nightshift.io.outputs import JobOutput, committed_files
from nightshift.io.parquetfiles import as_parquet
from nightshift.scheduling.dedup import ANSWERED_FROM

OK, FAILED, REJECTED = 1, 2, 3  # a position's answer kind (0: none yet)
MAX_BUCKETS = 64  # temporary files per kind: a bounded number of open files
MIN_BUCKET = 2048  # positions a bucket holds at least
SLICE = 256  # rows turned into Python objects at a time
_READ_BATCH = 2048
_READ_BUFFER = 1 << 20
_POS = "_position"
EMBEDDING = "embedding"  # an embed job's vector column
_TOKENS = ("prompt_tokens", "output_tokens")


@dataclass
class Source:
    """One file of the job's answers: its kind, where it lies here, and per row whether
    it is the answer kept for its record, and that record's position."""

    kind: int
    path: Path
    keep: np.ndarray | None = None
    position: np.ndarray | None = None


def answer_sources(job: str, tmp: Path) -> list[Source]:
    """The job's answer files, downloaded into ``tmp``, in the order an answer is kept:
    committed ok and failed rows, rejects, then uncommitted shards' checkpoints."""
    output = JobOutput(job)
    keys: list[tuple[int, str]] = []
    root = output.store.root + "/"
    for kind, what in ((OK, "results"), (FAILED, "failed"), (REJECTED, "rejects")):
        for uri in committed_files(job, what):
            keys.append((kind, uri.removeprefix(root)))
    keys += _checkpoints(output)
    sources = []
    for n, (kind, key) in enumerate(keys):
        if kind == REJECTED and not output.store.exists(key):
            continue  # a plan that rejected nothing wrote no rejects file
        local = output.store.download(key, tmp / f"{n}{PurePosixPath(key).suffix}")
        sources.append(Source(kind, as_parquet(local)))  # a checkpoint is Arrow IPC
    return sources


def _checkpoints(output: JobOutput) -> list[tuple[int, str]]:
    """The ok chunks, then the failed chunks, of every planned shard not committed."""
    manifest = output.plans.manifest()
    if manifest is None:
        return []
    committed = output.shards.committed()
    files = [
        f
        for shard in manifest["shards"]["each"]
        if shard["index"] not in committed
        for f in output.shards.checkpoint(shard["index"])
    ]
    kinds = {"ok": OK, "failed": FAILED}
    return [(kinds[f.kind], f.key) for want in ("ok", "failed") for f in files if f.kind == want]


def place(sources: list[Source], record_ids: pa.Array) -> np.ndarray:
    """Set each source's ``keep`` and ``position``; returns each position's kind."""
    kinds = np.zeros(len(record_ids), dtype=np.int8)
    for source in sources:
        ids = pq.read_table(source.path, columns=[ID_COLUMN]).column(ID_COLUMN)
        found = pc.index_in(ids, value_set=record_ids)
        position = found.fill_null(-1).to_numpy().astype(np.int64)
        keep = np.zeros(len(position), dtype=bool)
        _, first = np.unique(position, return_index=True)  # the first row of each record
        keep[first] = True
        keep &= position >= 0
        keep[keep] = kinds[position[keep]] == 0  # an earlier source answered it
        kinds[position[keep]] = source.kind
        source.keep, source.position = keep, position
    return kinds


def copy_tokens(sources: list[Source], ids: pa.Array) -> dict[int, tuple[int, int]]:
    """A dedup copy's position -> its original's prompt and output tokens.

    A copy's results row holds 0 tokens: what it cost the engine (report.json counts
    that). Its line describes the request itself: its prompt is the original's exactly
    (the dedup key is over the rendered prompt) and so is its answer. Its cached tokens
    are 0: a copy never reached the engine, so nothing was read from a cache for it
    (what dedup saved is report.json's ``repeats``, not passed off as cache reads)."""
    tokens = np.zeros((len(ids), 2), dtype=np.int64)
    copies: list[tuple[np.ndarray, pa.Array]] = []
    for source in sources:
        if source.kind != OK or ANSWERED_FROM not in pq.read_schema(source.path).names:
            continue
        table = pq.read_table(source.path, columns=[ANSWERED_FROM, *_TOKENS])
        table = table.filter(pa.array(source.keep))
        kept = source.position[source.keep]
        for n, name in enumerate(_TOKENS):
            tokens[kept, n] = table.column(name).fill_null(0).to_numpy()
        copy = pc.is_valid(table.column(ANSWERED_FROM)).to_numpy()
        if copy.any():
            copies.append((kept[copy], table.column(ANSWERED_FROM).filter(pa.array(copy))))
    fixes = {}
    for at, origin in copies:
        where = pc.index_in(origin, value_set=ids).fill_null(-1).to_numpy()
        for copy_at, o in zip(at.tolist(), where.tolist(), strict=True):
            if o >= 0:
                fixes[copy_at] = (int(tokens[o, 0]), int(tokens[o, 1]))
    return fixes


def rows_in_order(
    sources: list[Source], size: int, tmp: Path
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(position, kind, row) of every kept answer, in position order."""
    width = max(MIN_BUCKET, math.ceil(size / MAX_BUCKETS))
    buckets = _Buckets(tmp, width)
    try:
        for source in sources:
            buckets.spread(source)
    finally:
        buckets.close()
    for bucket in range(math.ceil(size / width) if size else 0):
        kinds = (buckets.sorted_rows(kind, bucket) for kind in (OK, FAILED, REJECTED))
        yield from heapq.merge(*kinds)


class _Buckets:
    """Per kind and bucket, one Arrow IPC file of the rows whose position falls in it."""

    def __init__(self, tmp: Path, width: int) -> None:
        self.tmp, self.width = tmp, width
        self.schemas: dict[int, pa.Schema] = {}
        self.writers: dict[tuple[int, int], pa.ipc.RecordBatchFileWriter] = {}

    def spread(self, source: Source) -> None:
        # pages read as batches need them, not a whole shard's column chunk at once
        file = pq.ParquetFile(source.path, pre_buffer=False, buffer_size=_READ_BUFFER)
        columns = _columns(source.kind, file.schema_arrow)
        start = 0
        for batch in file.iter_batches(batch_size=_READ_BATCH, columns=columns):
            end = start + batch.num_rows
            keep = source.keep[start:end]
            position = source.position[start:end][keep]
            start = end
            if not len(position):
                continue
            table = pa.Table.from_batches([batch]).filter(pa.array(keep))
            table = table.append_column(_POS, pa.array(position, pa.int64()))
            bucket = position // self.width
            for b in np.unique(bucket):
                self._write(source.kind, int(b), table.filter(pa.array(bucket == b)))

    def _write(self, kind: int, bucket: int, table: pa.Table) -> None:
        schema = self.schemas.setdefault(kind, table.schema)
        if table.schema != schema:  # a chunk from another nightshift version: its columns
            table = pa.table([_column(table, f) for f in schema], schema=schema)
        writer = self.writers.get((kind, bucket))
        if writer is None:
            writer = pa.ipc.new_file(str(self._path(kind, bucket)), schema)
            self.writers[(kind, bucket)] = writer
        writer.write_table(table)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    def _path(self, kind: int, bucket: int) -> Path:
        return self.tmp / f"bucket-{kind}-{bucket:05d}.arrow"

    def sorted_rows(self, kind: int, bucket: int) -> Iterator[tuple[int, int, dict[str, Any]]]:
        if (kind, bucket) not in self.writers:
            return
        path = self._path(kind, bucket)
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        table = table.take(pc.sort_indices(table.column(_POS)))
        for offset in range(0, table.num_rows, SLICE):
            for row in _rows(table.slice(offset, SLICE)):
                yield row.pop(_POS), kind, row
        del table
        path.unlink()


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows as dicts, an embedding as its output's ``Vector`` (made for the slice at
    once, never a list of Python floats)."""
    if EMBEDDING not in table.column_names:
        return table.to_pylist()
    vectors = read_vectors(table.column(EMBEDDING))
    rows = table.drop_columns([EMBEDDING]).to_pylist()
    for row, vector in zip(rows, vectors, strict=True):
        row[EMBEDDING] = vector
    return rows


def _columns(kind: int, schema: pa.Schema) -> list[str] | None:
    """What a rejects row is read for (its input columns are not needed); else all."""
    if kind != REJECTED:
        return None
    return [n for n in schema.names if n in (ID_COLUMN, "reason", "reject_kind")]


def _column(table: pa.Table, field: pa.Field) -> pa.Array:
    if field.name in table.column_names:
        return table.column(field.name).cast(field.type)
    return pa.nulls(table.num_rows, field.type)


def record_ids(records: Path) -> pa.Array:
    return pq.read_table(records, columns=[ID_COLUMN]).column(ID_COLUMN).combine_chunks()


def in_order(records: Path, job: str | None) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(position, kind, row) of every answered record of ``records``, in position order,
    dedup copies' token counts set to their originals' (``copy_tokens``)."""
    if job is None:
        return
    with tempfile.TemporaryDirectory(prefix="nightshift-lines-") as folder:
        tmp = Path(folder)
        ids = record_ids(records)
        sources = answer_sources(job, tmp)
        place(sources, ids)
        fixes = copy_tokens(sources, ids)
        for position, kind, row in rows_in_order(sources, len(ids), tmp):
            if kind == OK and position in fixes:
                prompt, output = fixes[position]
                row.update(prompt_tokens=prompt, output_tokens=output, cached_tokens=0)
            yield position, kind, row
