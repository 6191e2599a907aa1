"""A plan's memory: frames moved, not copied (scheduling.frames), and freed memory given back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from nightshift.scheduling.frames import attach, take_rows


def keys() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "record_id": ["a", "b", "c", "d"],
            "tokens": [5, 9, 2, 7],
            "blocks": [[1, 2], [1], None, [3, 4, 5]],
            "node": pl.Series([7, 0, 7, 9], dtype=pl.UInt64),
        }
    )


@pytest.mark.parametrize(
    "rows",
    [
        pl.Series([True, False, True, True]),
        pl.Series([3, 0, 2], dtype=pl.UInt32),
        pl.Series([], dtype=pl.Boolean).extend_constant(False, 4),
    ],
)
def test_take_rows_gives_the_rows_and_leaves_the_frame_it_was_given_empty(rows):
    frame, expected = keys(), keys()
    expected = expected.filter(rows) if rows.dtype == pl.Boolean else expected[rows]
    taken = take_rows(frame, rows)
    assert_frame_equal(taken, expected)
    assert frame.width == 0  # moved out, not copied: the caller's name holds nothing


def test_a_frame_left_as_it_was_when_a_clone_is_taken():
    frame = keys()
    take_rows(frame.clone(), pl.Series([1, 0], dtype=pl.UInt32))
    assert_frame_equal(frame, keys())


def test_attach_is_a_left_join_in_the_frame_order_with_null_where_nothing_matches():
    table = pl.DataFrame(
        {
            "node": pl.Series([9, 7, 4], dtype=pl.UInt64),
            "shared": [[10, 11], [12], [13]],
            "whole": [True, False, True],
        }
    )
    frame = keys().with_columns(pl.Series("node", [7, 0, None, 9], dtype=pl.UInt64))
    joined = attach(frame, table, "node")
    assert_frame_equal(joined, frame.join(table, on="node", how="left", maintain_order="left"))
    assert joined["shared"].to_list() == [[12], None, None, [10, 11]]
    assert frame.columns == ["record_id", "tokens", "blocks", "node"]  # untouched


def test_reading_input_hands_freed_memory_back_after_each_batch(tmp_path, monkeypatch):
    """A pass over the input holds one batch's worth: the allocators are asked to give back
    what each used batch freed (nightshift.memory), not only at the end."""
    import pyarrow.parquet as pq

    from nightshift.io import inputs

    pq.write_table(pl.DataFrame({"id": list(range(10))}).to_arrow(), tmp_path / "a.parquet")
    calls = []
    monkeypatch.setattr(inputs, "give_back_freed", lambda: calls.append(len(seen)))
    seen = []
    dataset = inputs.open_input(str(tmp_path / "a.parquet"))
    for batch in inputs.file_batches(dataset, 0, ["id"], 4):
        seen.append(batch.num_rows)
    assert seen == [4, 4, 2]
    assert calls == [1, 2, 3]  # after each batch was used, before the next was read


_FREED = """
import os, sys
import nightshift  # before polars, as every nightshift command imports it
import polars as pl

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

before = rss()
frame = pl.Series(range(20_000_000)) * 2  # 160 MB, and as much again while made
grown = rss() - before
del frame
print(os.environ["_RJEM_MALLOC_CONF"], grown, rss() - before)
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
def test_what_polars_frees_goes_back_to_the_system_at_once(tmp_path):
    """Polars' allocator (jemalloc) would keep what is freed for a second or two, and a
    plan's steps free hundreds of MB a second: nightshift has it hand pages back at once."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    shown = subprocess.run(
        [sys.executable, "-c", _FREED], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    conf, grown, left = shown[0], int(shown[1]), int(shown[2])
    assert conf.endswith(",dirty_decay_ms:0")  # after polars' own settings: it wins
    assert grown > 100 * 2**20  # the frame was there
    assert left < grown / 4  # and is gone


def test_an_allocator_setting_the_user_made_is_kept():
    env = {**os.environ, "_RJEM_MALLOC_CONF": "dirty_decay_ms:5000"}
    code = "import os, nightshift; print(os.environ['_RJEM_MALLOC_CONF'])"
    shown = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == "dirty_decay_ms:5000"
