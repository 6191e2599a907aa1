"""How nightshift writes Parquet: dictionary pages for columns that repeat, none for
floats (an embedding's distinct values made Parquet build a dictionary and throw it away)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nightshift.io import shardstore
from nightshift.io.objectstore import LocalStore
from nightshift.io.parquetfiles import as_parquet
from nightshift.io.shardstore import ShardStore


def _columns(data: bytes) -> dict[str, pq.ColumnChunkMetaData]:
    group = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0)
    return {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}


def _table() -> tuple[pa.Table, np.ndarray]:
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
    return table, vectors


@pytest.mark.parametrize("large", [False, True])
def test_floats_get_no_dictionary_and_repeating_columns_do(tmp_path, monkeypatch, large):
    table, vectors = _table()
    shards = ShardStore(LocalStore(tmp_path))
    if large:  # a shard over the limit: written to a file, then put (parts on S3)
        monkeypatch.setattr(shardstore, "PUT_IN_ONE", 1_000)
    assert shards.commit(0, "a1", {"ok": table}, {"records": 500})
    (done,) = shards.committed()[0]["files"]
    data = (tmp_path / done["key"]).read_bytes()
    _check(data, table, vectors)
    assert done["sha256"] == hashlib.sha256(data).hexdigest() and done["rows"] == 500


def test_a_checkpoint_chunk_is_arrow_and_an_earlier_parquet_chunk_still_reads(tmp_path):
    """Chunks only nightshift reads back are Arrow IPC (a tenth of Parquet's cost); a
    resume of a run whose chunks were Parquet reads them alike, and a batch's partial
    output (``batch.lineorder``) gets Parquet either way."""
    table, _ = _table()
    shards = ShardStore(LocalStore(tmp_path))
    (chunk,) = shards.write_chunk(0, "a1", 0, {"ok": table})
    path = tmp_path / chunk.key
    assert path.suffix == ".arrow" and pa.ipc.open_file(str(path)).read_all().equals(table)
    assert chunk.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    older = tmp_path / "_work/shard-00000/b2-00000.ok.parquet"
    pq.write_table(table.slice(0, 10), older)
    progress = {"shard": 0, "attempt": "b2", "updated": 0.0, "files": [
        {"key": older.relative_to(tmp_path).as_posix(), "rows": 10, "sha256": "", "kind": "ok"}
    ]}  # fmt: skip
    (tmp_path / "_work/shard-00000/progress-b2.json").write_text(json.dumps(progress))
    files = shards.checkpoint(0)
    assert sorted(f.rows for f in files) == [10, 500]
    assert sum(t.num_rows for t in shards.read(files, "ok")) == 510
    assert pq.read_table(as_parquet(path)).equals(table)
    assert as_parquet(older) == older


def _check(data: bytes, table: pa.Table, vectors: np.ndarray) -> None:
    columns = _columns(data)
    assert columns["label"].has_dictionary_page and columns["ticket_id"].has_dictionary_page
    assert columns["tags.list.element"].has_dictionary_page
    floats = [c for path, c in columns.items() if path.startswith(("embedding", "score"))]
    assert len(floats) == 2 and not any(c.has_dictionary_page for c in floats)
    assert all("BYTE_STREAM_SPLIT" in c.encodings for c in floats)  # zstd packs it better
    assert all(c.compression == "ZSTD" for c in columns.values())
    # min/max of a vector's elements skip no page: not written; every other column's are
    assert {path for path, c in columns.items() if not c.is_stats_set} == {"embedding.list.element"}
    back = pq.read_table(pa.BufferReader(data))
    assert back.equals(table)
    assert np.array_equal(np.stack(back["embedding"].to_numpy(zero_copy_only=False)), vectors)


def test_a_chunk_of_vectors_is_left_uncompressed_and_one_of_text_gets_lz4(tmp_path):
    """LZ4 cannot shrink float mantissas (it cost 1.1 µs a 576-float row for 0.6%): a
    chunk holding vectors is written plain, even vectors LZ4 would shrink (zeros here);
    one of labels and text is compressed."""
    zeros = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(500 * 64, np.float32)), 64)
    vectors = pa.table({"ticket_id": [f"t{i}" for i in range(500)], "embedding": zeros})
    text = pa.table({"ticket_id": ["t1"] * 500, "text": ["billing " * 20] * 500})
    shards = ShardStore(LocalStore(tmp_path))
    for n, (table, compressed) in enumerate(((vectors, False), (text, True))):
        (chunk,) = shards.write_chunk(0, "a1", n, {"ok": table})
        size = (tmp_path / chunk.key).stat().st_size
        assert (size < table.nbytes / 4) is compressed, (chunk.key, size, table.nbytes)
    back = shards.read(shards.checkpoint(0), "ok")
    assert back[0].equals(vectors) and back[1].equals(text)


@pytest.mark.parametrize("large", [False, True])
def test_a_shard_of_vectors_is_written_in_row_groups_and_short_rows_in_one(
    tmp_path, monkeypatch, large
):
    """Parquet's writer holds a whole row group while it encodes it: rows of vectors go
    in groups of about ROW_GROUP_BYTES; a shard of short rows stays one group."""
    from nightshift.io import parquetfiles

    monkeypatch.setattr(parquetfiles, "ROW_GROUP_BYTES", 256 * 1024)
    if large:
        monkeypatch.setattr(shardstore, "PUT_IN_ONE", 1_000)
    vectors = np.random.default_rng(1).uniform(-1, 1, (5000, 64)).astype(np.float32)
    wide = pa.table(
        {
            "ticket_id": [f"t{i}" for i in range(5000)],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 64),
        }
    )
    short = pa.table({"ticket_id": [f"t{i}" for i in range(5000)], "label": ["bug"] * 5000})
    shards = ShardStore(LocalStore(tmp_path))
    for shard, table in enumerate([wide, short]):
        assert shards.commit(shard, "a1", {"ok": table}, {"records": 5000})
    files = {s: m["files"][0]["key"] for s, m in shards.committed().items()}
    wide_file = pq.ParquetFile(tmp_path / files[0])
    rows = [wide_file.metadata.row_group(i).num_rows for i in range(wide_file.num_row_groups)]
    assert rows == [992] * 5 + [40]  # 264 bytes a row: 992 rows to 256 KB
    assert wide_file.read().equals(wide)
    assert pq.ParquetFile(tmp_path / files[1]).num_row_groups == 1


def test_write_parts_gathers_small_parts_into_row_groups_and_keeps_an_empty_table(
    tmp_path, monkeypatch
):
    """Checkpoint chunks are not row groups of their own: parts are gathered until a
    group holds ``row_group_rows``; an empty table still gets its schema and one group."""
    from nightshift.io import parquetfiles
    from nightshift.io.parquetfiles import row_group_rows, write_parts

    monkeypatch.setattr(parquetfiles, "ROW_GROUP_BYTES", 68 * 100)  # rows of 68 bytes
    parts = [pa.table({"v": np.full((10, 8), i, dtype=np.float64).tolist()}) for i in range(25)]
    assert row_group_rows(parts[0]) == 100
    assert write_parts(iter(parts), tmp_path / "a.parquet") == 250
    written = pq.ParquetFile(tmp_path / "a.parquet")
    groups = [written.metadata.row_group(i).num_rows for i in range(written.num_row_groups)]
    assert groups == [100, 100, 50]
    assert written.read().column("v").to_pylist() == pa.concat_tables(parts).column("v").to_pylist()
    empty = pa.table({"v": pa.array([], pa.list_(pa.float64()))})
    # an empty first part (a chunk whose rows another attempt's won) sets no group size:
    # a group is gathered and written at a time, not every part at once
    handed, write_table = [], pq.ParquetWriter.write_table
    monkeypatch.setattr(
        pq.ParquetWriter,
        "write_table",
        lambda self, table, **kw: handed.append(table.num_rows) or write_table(self, table, **kw),
    )
    assert write_parts([empty, *parts, empty], tmp_path / "b.parquet") == 250
    assert handed == [100, 100, 50]
    assert (
        pq.ParquetFile(tmp_path / "b.parquet").read().equals(pq.read_table(tmp_path / "a.parquet"))
    )
    assert write_parts([empty], tmp_path / "e.parquet") == 0
    assert pq.ParquetFile(tmp_path / "e.parquet").schema_arrow == empty.schema
    assert write_parts([], tmp_path / "none.parquet") == 0
    assert not (tmp_path / "none.parquet").exists()
