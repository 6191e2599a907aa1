"""The block keys of the part of each prompt that other prompts share.

The plan's first pass keeps only byte-chunk keys per record (``scheduling.measure``);
``depth_of`` then tells, over all records, how many leading chunks each shares and
with which node. This second pass reads again only the records that share a chunk, and
only the columns their prompts are made from (``RecordMeasurer.prompt_columns``), and
per node keeps the smallest and largest next chunk (their common start is the exact end
of the bytes the node's records all share) and the first record's pieces. Each node's
shared start is then encoded once, exactly as the run will encode it, and cut into KV
blocks; prompt tokens are made exact for that start (``RecordMeasurer.refine``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow.dataset as ds

from nightshift.io.inputs import READ_BATCH, file_batches, rows_at
from nightshift.memory import give_back_freed
from nightshift.scheduling.chunkkeys import ChunkKeys
from nightshift.scheduling.frames import attach
from nightshift.scheduling.helpers import Helpers, InOrder
from nightshift.scheduling.measure import RecordMeasurer
from nightshift.scheduling.order import leaves_of
from nightshift.scheduling.render import prompt_text
from nightshift.scheduling.sharing import (
    block_keys,
    common_length,
    cut_pieces,
    depth_of,
    word_pieces,
)

ROOT = 0  # the node of records that share no whole chunk with another


def shared_blocks(
    dataset: ds.FileSystemDataset,
    measurer: RecordMeasurer,
    runnable: pl.DataFrame,
    chunks: ChunkKeys,
    helpers: Helpers | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``runnable`` (with ``_seq``, each record's number in ``chunks``) with ``_leaf``, the
    last key of its shared blocks, in place of ``_seq``; and each leaf's blocks
    (``order.leaves_of``: ``order.prefix_levels`` takes both). ``helpers`` read the
    records' next chunks and encode the shared starts beside this process."""
    where = depth_of(chunks, runnable.drop_in_place("_seq").to_numpy().astype(np.int64))
    give_back_freed()  # the windows of keys read back
    runnable = runnable.with_columns(where["depth"], where["node"].fill_null(ROOT))
    ends = _next_chunks(dataset, measurer, runnable, helpers)
    table = _node_table(dataset, measurer, ends, runnable.height > 1, helpers)
    table, leaves = leaves_of(table)  # a node's records share its list: held once
    runnable = attach(runnable, table.drop("blocks"), "node").drop("depth", "node")
    return measurer.refine(runnable), leaves


def _node_table(
    dataset: ds.FileSystemDataset,
    measurer: RecordMeasurer,
    ends: pl.DataFrame,
    many: bool,
    helpers: Helpers | None,
) -> pl.DataFrame:
    """Per node (the root first: every prompt's common start, shared by ``many``), its
    shared start's block keys, bytes and tokens, and whether it is a whole prompt.

    Each node's start is cut from its first member's pieces, read again here a batch at
    a time: kept from ``_next_chunks`` as Python pieces, they were the plan's largest
    holding at a million records (170 MB for 178,000 nodes)."""
    root = _encoded_starts(measurer, [ROOT], [measurer.common_start()], [many])
    parts = [root]
    wanted = ends.select(
        "node", "_file", "_row", "depth", (pl.col("members") > 1).alias("many"),
        pl.Series("shared", _shared_lengths(ends, measurer.chunk), dtype=pl.Int64),
    )  # fmt: skip
    order = InOrder(helpers, lambda table, _: parts.append(table))
    for records, part in _wanted_records(dataset, measurer.prompt_columns, wanted):
        job = SharedStarts(measurer.block_size, records, part)
        order.add(job, functools.partial(job.run, measurer))
    order.finish()
    # The longest start two or more prompts share, in tokens: under one KV block, the
    # prefix cache (whole blocks only) reuses nothing, and the plan says why.
    table = pl.concat(parts)
    measurer.shared_start_tokens = int(table["_many_tokens"].max() or 0)
    return table.drop("_many_tokens")


@dataclass(frozen=True)
class SharedStarts:
    """The shared starts of some nodes (``part``: node, depth, shared bytes, shared by
    many) cut from their first members' prompts (``records``), encoded into block keys
    (a helper's job, or this process's: the same table)."""

    block_size: int
    records: pl.DataFrame
    part: pl.DataFrame

    def run(self, measurer: RecordMeasurer) -> pl.DataFrame:
        pieces, chunk = measurer.pieces(self.records), measurer.chunk
        # A node's only member may share more with records that go deeper: its own
        # blocks past the next chunk are its own, so it is first cut after that chunk.
        starts = [
            cut_pieces(cut_pieces([p[k] for p in pieces], (depth + 1) * chunk), shared)
            for k, (depth, shared) in enumerate(self.part.select("depth", "shared").iter_rows())
        ]
        many = self.part["many"].to_list()
        return _encoded_starts(measurer, self.part["node"], starts, many)


def _shared_lengths(ends: pl.DataFrame, chunk: int) -> list[int]:
    """Bytes each node's members share: its whole chunks and the common start of their
    next chunks. A node of one member is cut after its next chunk, past anything it
    could share with another."""
    depth, members = ends["depth"].to_list(), ends["members"].to_list()
    lowest, highest = ends["lowest"].to_list(), ends["highest"].to_list()
    return [
        d * chunk + common_length(lo, hi) if m > 1 else (d + 1) * chunk
        for d, m, lo, hi in zip(depth, members, lowest, highest, strict=True)
    ]


ENCODE_BATCH = 4096  # shared starts encoded at once: their ids are kept only as block keys

NODE_SCHEMA = {
    "node": pl.UInt64,
    "blocks": pl.List(pl.UInt64),
    "_shared_bytes": pl.Int64,
    "_shared_tokens": pl.Int64,
    "_shared_whole": pl.Boolean,
    "_many_tokens": pl.Int64,
}


def _encoded_starts(
    measurer: RecordMeasurer,
    nodes: pl.Series | list[int],
    starts: list[list[str]],
    shared_by_many: list[bool],
) -> pl.DataFrame:
    """Per node, its shared start (pieces) as block keys, bytes and tokens, and its tokens
    again where two or more prompts share it (``_many_tokens``, else 0). A slice at a
    time: every node's ids at once are a hundred Python ints each."""
    encoder, block_size = measurer.encoder, measurer.block_size
    blocks, tokens = [], []
    for at in range(0, len(starts), ENCODE_BATCH):
        part = starts[at : at + ENCODE_BATCH]
        for ids in encoder.encode_pieces(
            [word_pieces(p) for p in part] if encoder.composes else part
        ):
            blocks.append(block_keys(ids, block_size))
            tokens.append(len(ids))
    frame = {
        "node": nodes,
        "blocks": blocks,
        "_shared_bytes": [sum(len(p.encode()) for p in cut) for cut in starts],
        "_shared_tokens": tokens,
        "_shared_whole": [cut[-1] != "" for cut in starts],
        "_many_tokens": [t if m else 0 for t, m in zip(tokens, shared_by_many, strict=True)],
    }
    return pl.DataFrame(frame, schema=NODE_SCHEMA)


def _wanted_records(
    dataset: ds.FileSystemDataset, columns: list[str], wanted: pl.DataFrame
) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    """The input records at ``wanted``'s ``_file`` and ``_row``, a read batch at a time,
    each with its rows of ``wanted`` (in file and row order)."""
    for (index,), rows_of in wanted.sort("_file", "_row").group_by("_file", maintain_order=True):
        batches = file_batches(dataset, int(index), columns, READ_BATCH)
        for picked, lo, hi in rows_at(batches, rows_of["_row"].to_numpy()):
            yield pl.from_arrow(picked), rows_of.slice(lo, hi - lo)


MERGE_AT_LEAST = 65_536  # rows of chunk ends waiting before a merge, at the least


def _next_chunks(
    dataset: ds.FileSystemDataset,
    measurer: RecordMeasurer,
    runnable: pl.DataFrame,
    helpers: Helpers | None = None,
) -> pl.DataFrame:
    """Per node: its depth, members, smallest and largest next chunk, and where its
    first member (in input order) is: ``_file``, ``_row``."""
    need = runnable.filter(pl.col("depth") > 0).select("_file", "_row", "depth", "node")
    need = need.sort("_file", "_row")  # input order, whatever order the records came in
    merging = _Merging()
    order = InOrder(helpers, lambda ends, _: merging.add(ends))
    for records, part in _wanted_records(dataset, measurer.prompt_columns, need):
        job = ChunkEnds(measurer.block_size, records, part)
        order.add(job, functools.partial(job.run, measurer))
    order.finish()
    # a node's first row is its first member
    firsts = need.unique("node", keep="first", maintain_order=True).select("node", "_file", "_row")
    return attach(merging.done(), firsts, "node")


@dataclass(frozen=True)
class ChunkEnds:
    """Some records' nodes (``part``: their depth and node), each with its chunk after
    the shared ones as its smallest and largest, merged by node (a helper's job, or
    this process's)."""

    block_size: int
    records: pl.DataFrame
    part: pl.DataFrame

    def run(self, measurer: RecordMeasurer) -> pl.DataFrame:
        return _merged(_chunk_ends(measurer, self.records, self.part))


class _Merging:
    """Every node's chunk ends so far, merged as they come."""

    def __init__(self) -> None:
        self.ends, self.waiting = pl.DataFrame(schema=_ENDS), []

    def add(self, ends: pl.DataFrame) -> None:
        self.waiting.append(ends)
        # merged as it goes (a batch's nodes, kept a batch at a time, were 0.1 GiB more
        # than the nodes themselves at a million records), but only once a quarter as
        # many rows wait as are merged: merging every batch into all the nodes so far
        # took time in the square of the records (36 s of a 3,000,000-record plan, 6 at
        # 1,000,000); a quarter keeps what waits small beside the nodes
        if sum(w.height for w in self.waiting) >= max(self.ends.height // 4, MERGE_AT_LEAST):
            self.done()

    def done(self) -> pl.DataFrame:
        if self.waiting:
            self.ends, self.waiting = _merged(pl.concat([self.ends, *self.waiting])), []
        return self.ends


_ENDS = {
    "node": pl.UInt64,
    "depth": pl.UInt32,
    "members": pl.UInt32,
    "lowest": pl.Binary,
    "highest": pl.Binary,
}


def _chunk_ends(
    measurer: RecordMeasurer, records: pl.DataFrame, keys: pl.DataFrame
) -> pl.DataFrame:
    """``records``' nodes (``keys``: their depth and node), each a member with its chunk
    after the shared ones as both its smallest and largest."""
    text = prompt_text(measurer.pieces(records)).cast(pl.Binary)
    start = keys["depth"].cast(pl.Int64) * measurer.chunk
    following = text.bin.slice(start, measurer.chunk)
    return keys.select(
        "node",
        "depth",
        pl.lit(1, dtype=pl.UInt32).alias("members"),
        following.alias("lowest"),
        following.alias("highest"),
    )


def _merged(ends: pl.DataFrame) -> pl.DataFrame:
    """One row a node: members summed, the smallest and largest next chunk kept."""
    return ends.group_by("node").agg(
        pl.col("depth").first(),
        pl.col("members").sum(),
        pl.col("lowest").min(),
        pl.col("highest").max(),
    )
