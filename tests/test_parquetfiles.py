"""How nightshift writes Parquet: dictionary pages for columns that repeat, none for
floats (an embedding's distinct values made Parquet build a dictionary and throw it away)."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nightshift.io import shardstore
from nightshift.io.objectstore import LocalStore
from nightshift.io.shardstore import ShardStore


def _columns(data: bytes) -> dict[str, pq.ColumnChunkMetaData]:
    group = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0)
    return {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}


def test_floats_get_no_dictionary_and_repeating_columns_do(tmp_path, monkeypatch):
    vectors = np.random.default_rng(0).uniform(-1, 1, (500, 16)).astype(np.float32)
    table = pa.table(
        {
            "ticket_id": [f"t{i}" for i in range(500)],
            "label": ["billing", "bug"] * 250,
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 16),
            "score": np.linspace(0, 1, 500),
            "tags": [["vip", "eu"], ["eu"]] * 250,  # a kept list column: leaves repeat
        }
    )
    shards = ShardStore(LocalStore(tmp_path))
    (chunk,) = shards.write_chunk(0, "a1", 0, {"ok": table})  # from memory
    _check((tmp_path / chunk.key).read_bytes(), table, vectors)
    monkeypatch.setattr(shardstore, "PUT_IN_ONE", 1_000)  # a large shard: through a file
    assert shards.commit(0, "a1", {"ok": table}, {"records": 500})
    (done,) = shards.committed()[0]["files"]
    data = (tmp_path / done["key"]).read_bytes()
    _check(data, table, vectors)
    assert done["sha256"] == chunk.sha256 == hashlib.sha256(data).hexdigest()


def _check(data: bytes, table: pa.Table, vectors: np.ndarray) -> None:
    columns = _columns(data)
    assert columns["label"].has_dictionary_page and columns["ticket_id"].has_dictionary_page
    assert columns["tags.list.element"].has_dictionary_page
    floats = [c for path, c in columns.items() if path.startswith(("embedding", "score"))]
    assert len(floats) == 2 and not any(c.has_dictionary_page for c in floats)
    assert all(c.compression == "ZSTD" for c in columns.values())
    back = pq.read_table(pa.BufferReader(data))
    assert back.equals(table)
    assert np.array_equal(np.stack(back["embedding"].to_numpy(zero_copy_only=False)), vectors)
