"""How nightshift writes its tables: Parquet for what users read, Arrow IPC for the
checkpoints only nightshift reads back.

Parquet files get zstd, and dictionary pages only where they pay: for columns that
repeat (ids, labels, finish reasons), never for floats: an embedding's values are all
distinct, so Parquet builds a dictionary, finds it too large and falls back to plain
pages, having spent half the write on it (12.7 µs a 576-float vector against 5.7
without, and a larger file). Floats are written byte-stream-split instead, which zstd
compresses twice as well (normalised 576-float vectors: 16% smaller than plain, against
8%) in the same time; polars, pyarrow and DuckDB read it.

Statistics (min/max) are written for every column but the elements of vectors: no
reader skips a page by them, and they cost 0.5 µs a 576-float row.

A checkpoint chunk is written once and read once, by the shard's commit (or a resume):
as an Arrow IPC file it costs 0.2 µs a 576-float row to write and next to nothing to
read, against 6.2 and 4.4 as Parquet. Chunks are LZ4-compressed, except those that hold
vectors: LZ4 cannot shrink float mantissas (0.6% smaller) and took 1.1 µs a row.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

COMPRESSION = "zstd"
CHUNK_SUFFIX = ".arrow"
CHUNK_COMPRESSION = "lz4"


def write_options(schema: pa.Schema) -> dict[str, Any]:
    """``pq.write_table``/``ParquetWriter`` keywords for a table of ``schema``."""
    repeating, floats = _leaves(schema)
    vectors = {path for path in floats if ".list." in path}
    return {
        "compression": COMPRESSION,
        "use_dictionary": list(repeating),
        "use_byte_stream_split": list(floats) or False,
        # min/max over a vector's elements says nothing a reader can skip pages by
        "write_statistics": [path for path in repeating + floats if path not in vectors],
    }


# A row group's size in memory. Parquet's writer holds several times a whole row group
# while it encodes one: a shard of 107,000 embeddings written as one group (pyarrow's
# default holds a million rows) took 542 MB of Arrow's memory, in groups of 8,192 rows
# 46 MB, and wrote faster. Short text rows still make one group of a whole shard.
ROW_GROUP_BYTES = 16 << 20


def row_group_rows(table: pa.Table) -> int:
    """Rows a row group of ``table`` holds: about ``ROW_GROUP_BYTES``, 64 at least."""
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    return max(64, ROW_GROUP_BYTES // per_row)


def write_parquet(table: pa.Table, sink: Any) -> None:
    """``table`` as one Parquet file to ``sink`` (a path or a stream), as nightshift writes
    every results file: ``write_options`` and row groups of ``row_group_rows``."""
    write_parts([table], sink)


def write_parts(parts: Iterable[pa.Table], sink: Any) -> int:
    """``write_parquet`` of the table ``parts`` make, in order; returns the rows written.
    Small parts are gathered into one row group (a shard's checkpoint chunks are not
    row groups of their own); a row group is written once it holds ``row_group_rows``,
    so memory holds about one row group and one part. Nothing is written without a
    part (the first gives the schema); an empty table makes one empty row group."""
    parts = iter(parts)
    first = next(parts, None)
    if first is None:
        return 0
    schema, target = first.schema, None  # rows a group: from its first part with rows
    gathered, rows, written = [], 0, 0
    every = itertools.chain([first], parts, [None])
    del first  # not held once written
    with pq.ParquetWriter(sink, schema, **write_options(schema)) as writer:
        for part in every:
            if part is not None and (target is None or rows < target):
                gathered.append(part)
                rows += part.num_rows
                target = target or (row_group_rows(part) if part.num_rows else None)
                continue
            if rows or not written:  # the last group; an empty table's one group
                group = pa.concat_tables(gathered)
                writer.write_table(group, row_group_size=row_group_rows(group))
                written += group.num_rows
            gathered, rows = ([part], part.num_rows) if part is not None else ([], 0)
            target = row_group_rows(part) if part is not None and part.num_rows else None
    return written


def parquet_bytes(table: pa.Table) -> pa.Buffer:
    """``table`` as one Parquet file, in memory."""
    sink = pa.BufferOutputStream()
    write_parquet(table, sink)
    return sink.getvalue()


def chunk_bytes(table: pa.Table) -> pa.Buffer:
    """``table`` as one Arrow IPC file (LZ4 unless it holds vectors), in memory: a
    checkpoint chunk."""
    sink = pa.BufferOutputStream()
    vectors = any(".list." in path for path in _leaves(table.schema)[1])
    options = pa.ipc.IpcWriteOptions(compression=None if vectors else CHUNK_COMPRESSION)
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue()


def read_table(data: bytes, name: str) -> pa.Table:
    """A table ``chunk_bytes`` or Parquet wrote, by its file's ``name`` (a checkpoint
    of an earlier nightshift is Parquet)."""
    if name.endswith(CHUNK_SUFFIX):
        return pa.ipc.open_file(pa.BufferReader(data)).read_all()
    return pq.read_table(pa.BufferReader(data))


def as_parquet(path: Path) -> Path:
    """``path``, or a checkpoint chunk there rewritten as Parquet beside it (for readers
    that read Parquet files: ``batch.lineorder``)."""
    if not path.name.endswith(CHUNK_SUFFIX):
        return path
    target = path.with_suffix(".parquet")
    pq.write_table(read_table(path.read_bytes(), path.name), target, compression="none")
    return target


@functools.lru_cache(maxsize=64)
def _leaves(schema: pa.Schema) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Parquet's own paths of ``schema``'s leaf columns (``tags.list.element``: what
    ``use_dictionary`` and ``use_byte_stream_split`` match): those that do not hold
    floats, and those that do."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    leaves = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    floats = {"FLOAT", "DOUBLE"}
    return (
        tuple(c.path for c in leaves if c.physical_type not in floats),
        tuple(c.path for c in leaves if c.physical_type in floats),
    )
