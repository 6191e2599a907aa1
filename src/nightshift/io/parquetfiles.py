"""How nightshift writes its Parquet files: zstd, dictionary pages only where they pay.

A dictionary page pays for columns that repeat (ids, labels, finish reasons), never for
floats: an embedding's values are all distinct, so Parquet builds a dictionary, finds it
too large and falls back to plain pages, having spent half the write on it (12.7 µs a
576-float vector against 5.7 without, and a larger file).
"""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

COMPRESSION = "zstd"


def write_options(schema: pa.Schema) -> dict[str, Any]:
    """``pq.write_table``/``ParquetWriter`` keywords for a table of ``schema``."""
    return {"compression": COMPRESSION, "use_dictionary": list(_repeating_leaves(schema))}


def parquet_bytes(table: pa.Table) -> pa.Buffer:
    """``table`` as one Parquet file, in memory."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **write_options(table.schema))
    return sink.getvalue()


@functools.lru_cache(maxsize=64)
def _repeating_leaves(schema: pa.Schema) -> tuple[str, ...]:
    """Parquet's own paths of ``schema``'s leaf columns (``tags.list.element``: what
    ``use_dictionary`` matches), but those holding floats."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    leaves = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    floats = {"FLOAT", "DOUBLE"}
    return tuple(c.path for c in leaves if c.physical_type not in floats)
