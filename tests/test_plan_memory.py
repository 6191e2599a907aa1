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


def _texts(count: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    stems = ["", "s" * 64, "s" * 200 + "t" * 64, "u" * 70, "d" * 900]  # one goes deep
    return [
        rng.choice(stems) + "".join(rng.choices("ab", k=rng.randint(0, 260))) for _ in range(count)
    ]


@pytest.mark.parametrize("at_once", [0, 3, 40, 1 << 20])
def test_depth_from_the_chunk_key_file_is_depth_from_keys_in_memory(at_once, monkeypatch):
    """Keys added slice by slice, read back a window of levels at a time for some of the
    records in any order, give what counting every shared key by hand gives over those
    records: level by level, windows, the rest at once, and each mixed."""
    from collections import Counter

    import numpy as np

    from nightshift.scheduling import sharing
    from nightshift.scheduling.chunkkeys import ChunkKeys
    from nightshift.scheduling.sharing import chunk_keys, depth_of

    monkeypatch.setattr(sharing, "AT_ONCE_KEYS", at_once)
    keys = chunk_keys(pl.Series(_texts(400, 5)), 64)
    wanted = np.random.default_rng(3).permutation(400)[:300]  # a subset, shuffled
    with ChunkKeys() as chunks:
        start = 0
        for size in (1, 0, 120, 7, 200, 72):  # slices of any size, an empty one too
            chunks.add(keys.slice(start, size))
            start += size
        got = depth_of(chunks, wanted)
    rows = [keys[int(k)].to_list() for k in wanted]
    seen = Counter(k for row in rows for k in row)
    expected = []
    for row in rows:
        depth = next((d for d, k in enumerate(row) if seen[k] < 2), len(row))
        expected.append((depth, row[depth - 1] if depth else None))
    assert list(zip(got["depth"].to_list(), got["node"].to_list(), strict=True)) == expected
    assert max(d for d, _ in expected) >= 14  # the long stem: many windows deep


def test_the_chunk_key_file_gives_back_a_window_of_levels_and_is_removed_when_closed():
    import tempfile

    import numpy as np

    from nightshift.scheduling.chunkkeys import ChunkKeys

    lists = pl.Series([[1, 2, 3], None, [4], [5, 6, 7, 8], []], dtype=pl.List(pl.UInt64))
    chunks = ChunkKeys()
    chunks.add(lists.slice(0, 2))
    chunks.add(None, 0)
    chunks.add(lists.slice(2, 3))
    assert chunks.records == 5 and chunks.counts().tolist() == [3, 0, 1, 4, 0]
    takes, values = chunks.gather(np.array([0, 1, 3, 4]), 1, 2)
    assert takes.tolist() == [2, 0, 2, 0] and values.tolist() == [2, 3, 6, 7]
    takes, values = chunks.gather(np.array([2, 3]), 0, None)
    assert takes.tolist() == [1, 4] and values.tolist() == [4, 5, 6, 7, 8]
    with pytest.raises(RuntimeError, match="before any is read back"):
        chunks.add(lists)
    assert not list(Path(tempfile.gettempdir()).glob("nightshift-chunks-*"))  # no name
    chunks.close()
    assert chunks._file.closed


def test_the_plan_keeps_no_chunk_keys_in_its_key_frame(models, questions_input, tmp_path):
    """The first pass hands each record's chunk keys to the file and keeps its number."""
    from nightshift.scheduling.chunkkeys import ChunkKeys
    from nightshift.scheduling.firstpass import measure_input
    from nightshift.scheduling.kvcache import block_size
    from nightshift.scheduling.measure import RecordMeasurer
    from nightshift.scheduling.plan import load_encoder, open_job_input
    from tests.questions import questions_spec

    spec = questions_spec(models, questions_input, tmp_path / "out")
    dataset, columns = open_job_input(spec)
    measurer = RecordMeasurer(spec, load_encoder(spec), block_size(spec))
    with ChunkKeys() as chunks:
        keys = measure_input(dataset, columns, measurer, False, None, chunks)
        assert "_chunks" not in keys.columns
        assert keys["_seq"].to_list() == list(range(keys.height)) == list(range(chunks.records))
        assert (chunks.counts() > 0).sum() == keys["reject_kind"].is_null().sum() > 0
