"""Kept input columns come out in the results with their input's types and values, for
every kind of Arrow column a user's Parquet may hold (the feed turns the plan's Arrow
into each record's values, the results table turns them back)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq

from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records
from .durable import assert_exactly_once, committed_ids

ROWS = 20  # within a day's hours
UTC = dt.timezone.utc

COLUMNS = {  # name -> (Arrow type, the value of row i)
    "when_tz": (pa.timestamp("us", tz="UTC"), lambda i: dt.datetime(2026, 1, 1, i, tzinfo=UTC)),
    "when_ms": (pa.timestamp("ms"), lambda i: dt.datetime(2025, 5, 5, 0, 0, i)),
    "day": (pa.date32(), lambda i: dt.date(2024, 2, 1 + i % 28)),
    "price": (pa.decimal128(12, 3), lambda i: Decimal(f"{i}.125")),
    "tags": (pa.list_(pa.string()), lambda i: [f"t{i}", "x"] if i % 3 else []),
    "where": (pa.struct([("c", pa.string()), ("n", pa.int16())]), lambda i: {"c": "c", "n": i}),
    "tier": (pa.dictionary(pa.int8(), pa.string()), lambda i: ["free", "pro"][i % 2]),
    "big": (pa.uint64(), lambda i: 2**63 + i),
    "flag": (pa.bool_(), lambda i: None if i % 5 == 0 else bool(i % 2)),
    "blob": (pa.binary(), lambda i: bytes([i, 0, 255])),
    "took": (pa.duration("ms"), lambda i: dt.timedelta(milliseconds=i)),
}  # fmt: skip


def _input(tmp_path):
    schema = pa.schema(
        [("ticket_id", pa.string()), ("subject", pa.string()), ("body", pa.string())]
        + [(name, kind) for name, (kind, _) in COLUMNS.items()]
    )
    rows = [
        {
            "ticket_id": f"t{i}",
            "subject": f"subject {i}",
            "body": f"body {i}",
            **{name: value(i) for name, (_, value) in COLUMNS.items()},
        }
        for i in range(ROWS)
    ]
    write_records(tmp_path / "in" / "a.parquet", rows, schema=schema)
    return tmp_path / "in", rows


def test_kept_columns_keep_their_types_and_values(models, tmp_path):
    inputs, rows = _input(tmp_path)
    out = tmp_path / "out"
    data = spec_dict(models["chat"], inputs, out)
    data["input"]["keep_columns"] = ["subject", *COLUMNS]
    data["run"] = {"engine": "fake", "chunk_records": 8}
    run_job(validate_spec(data), progress=False)
    assert_exactly_once(str(out), "ticket_id", [r["ticket_id"] for r in rows])
    assert committed_ids(str(out), "ticket_id")["failed"] == []

    table = pa.concat_tables(pq.read_table(f) for f in (out / "results").glob("*.parquet"))
    expected = pq.read_schema(inputs / "a.parquet")
    for name in COLUMNS:
        assert table.schema.field(name).type == expected.field(name).type, name
    by_id = {r["ticket_id"]: r for r in table.to_pylist()}
    for row in rows:
        got = by_id[row["ticket_id"]]
        assert {n: got[n] for n in COLUMNS} == {n: row[n] for n in COLUMNS}


def _run_keeping(models, tmp_path, table: pa.Table, keep: list[str]) -> pa.Table:
    """``table`` as a job's input, ``keep`` kept; its results, every id once."""
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    out = tmp_path / "out"
    data = spec_dict(models["chat"], tmp_path / "in", out)
    data["input"]["keep_columns"] = ["subject", *keep]
    data["run"] = {"engine": "fake"}
    run_job(validate_spec(data), progress=False)
    assert_exactly_once(str(out), "ticket_id", table["ticket_id"].to_pylist())
    return pa.concat_tables(pq.read_table(f) for f in (out / "results").glob("*.parquet"))


def _tickets() -> pa.Table:
    rows = [{"ticket_id": f"t{i}", "subject": "s", "body": f"b {i}"} for i in range(ROWS)]
    return pa.Table.from_pylist(rows)


def test_nanosecond_times_are_kept_to_the_microsecond(models, tmp_path):
    """Python's datetime holds microseconds: a kept nanosecond time is cut to them (as
    always, with pandas installed or not), never a failed run."""
    stamp = pa.array([1_700_000_000_123_456_789 + i for i in range(ROWS)], pa.timestamp("ns"))
    results = _run_keeping(models, tmp_path, _tickets().append_column("at", stamp), ["at"])
    assert results.schema.field("at").type == pa.timestamp("ns")
    got = results["at"].cast(pa.int64()).to_pylist()
    assert got == [1_700_000_000_123_456_000] * ROWS


def test_an_extension_type_keeps_its_type_and_values(models, tmp_path):
    """``bool8`` is an extension type whose Python values Arrow gives as bools, which its
    results column refuses: it is kept as its stored values, as polars gives them."""
    storage = pa.array([i % 2 for i in range(ROWS)], pa.int8())
    flags = pa.ExtensionArray.from_storage(pa.bool8(), storage)
    results = _run_keeping(models, tmp_path, _tickets().append_column("flag", flags), ["flag"])
    assert results.schema.field("flag").type == pa.bool8()
    got = dict(
        zip(
            results["ticket_id"].to_pylist(),
            results["flag"].combine_chunks().storage.to_pylist(),
            strict=True,
        )
    )
    assert got == {f"t{i}": i % 2 for i in range(ROWS)}
