"""Reading input files a batch at a time (io.inputs.file_batches): typed as the whole
input types them, in the job's column order, and a file that breaks mid-read is named."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nightshift.errors import InputError
from nightshift.io.inputs import file_batches, open_input


def _write(path, table, **options):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **options)


def test_columns_a_file_lacks_or_leaves_null_are_typed_nulls(tmp_path):
    _write(tmp_path / "in" / "a.parquet", pa.table({"body": ["x", "y"], "id": [1, 2]}))
    _write(tmp_path / "in" / "b.parquet", pa.table({"id": [3], "tier": ["gold"]}))
    _write(
        tmp_path / "in" / "c.parquet",
        pa.table({"id": [4], "body": pa.nulls(1), "tier": pa.nulls(1)}),
    )
    dataset = open_input(str(tmp_path / "in"))
    read = [
        pa.Table.from_batches(list(file_batches(dataset, k, ["id", "tier", "body"], 1)))
        for k in range(3)
    ]
    wanted = pa.schema([("id", pa.int64()), ("tier", pa.string()), ("body", pa.string())])
    assert all(table.schema == wanted for table in read)
    assert [t.to_pylist() for t in read] == [
        [{"id": 1, "tier": None, "body": "x"}, {"id": 2, "tier": None, "body": "y"}],
        [{"id": 3, "tier": "gold", "body": None}],
        [{"id": 4, "tier": None, "body": None}],
    ]


def test_a_file_read_in_batches_keeps_row_order_over_row_groups(tmp_path):
    ids = list(range(1000))
    _write(tmp_path / "in.parquet", pa.table({"id": ids}), row_group_size=300)
    batches = list(file_batches(open_input(str(tmp_path / "in.parquet")), 0, ["id"], 128))
    assert max(b.num_rows for b in batches) <= 128
    assert [i for b in batches for i in b.column("id").to_pylist()] == ids


def test_a_file_broken_after_its_footer_was_read_is_named(tmp_path):
    path = tmp_path / "in.parquet"
    _write(path, pa.table({"id": list(range(5000))}), compression="snappy")
    dataset = open_input(str(path))  # the footer is read here, and is whole
    data = bytearray(path.read_bytes())
    data[4:2000] = b"\xff" * 1996  # the first data page
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="in.parquet"):
        list(file_batches(dataset, 0, ["id"], 1000))


def test_a_file_rewritten_with_another_type_since_it_was_listed_is_named(tmp_path):
    path = tmp_path / "in" / "a.parquet"
    _write(path, pa.table({"id": [1], "x": ["a"]}))
    dataset = open_input(str(tmp_path / "in"))
    _write(path, pa.table({"id": [1], "x": pa.array([["a"]])}))  # text became a list
    with pytest.raises(InputError, match="a.parquet"):
        list(file_batches(dataset, 0, ["id", "x"], 4))
