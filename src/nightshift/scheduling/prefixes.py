"""The block keys of the part of each prompt that other prompts share.

The plan's first pass keeps only byte-chunk keys per record (``scheduling.measure``);
``shared_depth`` then tells, over all records, how many leading chunks each shares and
with which node. This second pass reads again only the records that share a chunk, and
per node keeps the smallest and largest next chunk (their common start is the exact end
of the bytes the node's records all share) and the first record's pieces. Each node's
shared start is then encoded once, exactly as the run will encode it, and cut into KV
blocks; prompt tokens are made exact for that start (``RecordMeasurer.refine``).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds

from nightshift.io.inputs import READ_BATCH, file_batches
from nightshift.scheduling.frames import attach
from nightshift.scheduling.measure import RecordMeasurer
from nightshift.scheduling.render import prompt_text
from nightshift.scheduling.sharing import (
    block_keys,
    common_length,
    cut_pieces,
    shared_depth,
    word_pieces,
)

ROOT = 0  # the node of records that share no whole chunk with another


def shared_blocks(
    dataset: ds.FileSystemDataset,
    columns: list[str],
    measurer: RecordMeasurer,
    runnable: pl.DataFrame,
    block_size: int,
) -> pl.DataFrame:
    """``runnable`` (with ``_chunks``) with ``blocks`` in place of ``_chunks``. Takes
    ``_chunks`` out of ``runnable``: more than half a plan's keys, freed once read."""
    # One piece per read batch until here: made one here, so shared_depth's own copy
    # is none and the batches' pieces are freed before it starts.
    where = shared_depth(runnable.drop_in_place("_chunks").rechunk())
    runnable = runnable.with_columns(where["depth"], where["node"].fill_null(ROOT))
    ends, firsts = _next_chunks(dataset, columns, measurer, runnable)
    table = _node_table(measurer, ends, firsts, runnable.height > 1, block_size)
    runnable = attach(runnable, table, "node").drop("depth", "node")
    return measurer.refine(runnable)


def _node_table(
    measurer: RecordMeasurer,
    ends: pl.DataFrame,
    firsts: dict[int, list[str]],
    many: bool,
    block_size: int,
) -> pl.DataFrame:
    """Per node (the root first: every prompt's common start, shared by ``many``), its
    shared start's block keys, bytes and tokens, and whether it is a whole prompt. Its
    own function, so the starts' pieces and ids (Python objects, a few hundred bytes a
    node) are freed before the records are joined to it."""
    chunk = measurer.chunk
    nodes, prefixes = [ROOT], [measurer.common_start()]
    shared_by_many = [many]
    for row in ends.iter_rows(named=True):
        # Members of a node share its blocks, so they are cut where all of them still
        # agree. A node's only member may share more with records that go deeper: its
        # own blocks past that are its own (no other record has their keys), so it is
        # cut after the next chunk, past anything it could share.
        shared = (row["depth"] + 1) * chunk
        if row["members"] > 1:
            shared = row["depth"] * chunk + common_length(row["lowest"], row["highest"])
        nodes.append(row["node"])
        prefixes.append(cut_pieces(firsts.pop(row["node"]), shared))
        shared_by_many.append(row["members"] > 1)
    blocks, tokens, many_tokens = _encode_shared_starts(
        measurer, prefixes, shared_by_many, block_size
    )
    # The longest start two or more prompts share, in tokens: under one KV block, the
    # prefix cache (whole blocks only) reuses nothing, and the plan says why.
    measurer.shared_start_tokens = many_tokens
    return pl.DataFrame(
        {
            "node": nodes,
            "blocks": blocks,
            "_shared_bytes": [sum(len(p.encode()) for p in cut) for cut in prefixes],
            "_shared_tokens": tokens,
            "_shared_whole": [cut[-1] != "" for cut in prefixes],
        },
        schema={
            "node": pl.UInt64,
            "blocks": pl.List(pl.UInt64),
            "_shared_bytes": pl.Int64,
            "_shared_tokens": pl.Int64,
            "_shared_whole": pl.Boolean,
        },
    )


ENCODE_BATCH = 4096  # shared starts encoded at once: their ids are kept only as block keys


def _encode_shared_starts(
    measurer: RecordMeasurer,
    prefixes: list[list[str]],
    shared_by_many: list[bool],
    block_size: int,
) -> tuple[list[list[int]], list[int], int]:
    """Per shared start (its pieces): its block keys and its length in tokens, and the
    longest that two or more prompts share. A slice at a time: the ids of every node at
    once are a hundred tokens each for a hundred thousand nodes, as Python ints."""
    encoder = measurer.encoder
    blocks, tokens, many_tokens = [], [], 0
    for at in range(0, len(prefixes), ENCODE_BATCH):
        part = prefixes[at : at + ENCODE_BATCH]
        encoded = encoder.encode_pieces(
            [word_pieces(p) for p in part] if encoder.composes else part
        )
        for ids, many in zip(encoded, shared_by_many[at : at + ENCODE_BATCH], strict=True):
            blocks.append(block_keys(ids, block_size))
            tokens.append(len(ids))
            many_tokens = max(many_tokens, len(ids)) if many else many_tokens
    return blocks, tokens, many_tokens


def _next_chunks(
    dataset: ds.FileSystemDataset,
    columns: list[str],
    measurer: RecordMeasurer,
    runnable: pl.DataFrame,
) -> tuple[pl.DataFrame, dict[int, list[str]]]:
    """Per node: its depth, members, smallest and largest next chunk; and the pieces of
    its first member (in input order), cut after the next chunk."""
    need = runnable.filter(pl.col("depth") > 0).select("_file", "_row", "depth", "node")
    parts, firsts = [], {}
    for (index,), wanted in need.sort("_file", "_row").group_by("_file", maintain_order=True):
        rows = wanted["_row"].to_numpy()
        row = 0
        for batch in file_batches(dataset, int(index), columns, READ_BATCH):
            lo, hi = np.searchsorted(rows, [row, row + batch.num_rows])
            if hi > lo:
                picked = pa.Table.from_batches([batch]).take(rows[lo:hi] - row)
                part = wanted.slice(int(lo), int(hi - lo))
                parts.append(_chunk_ends(measurer, pl.from_arrow(picked), part, firsts))
            row += batch.num_rows
    empty = {"node": pl.UInt64, "depth": pl.UInt32, "members": pl.UInt32}
    if not parts:
        return pl.DataFrame(schema=empty | {"lowest": pl.Binary, "highest": pl.Binary}), firsts
    ends = (
        pl.concat(parts)
        .group_by("node")
        .agg(
            pl.col("depth").first(),
            pl.col("members").sum(),
            pl.col("lowest").min(),
            pl.col("highest").max(),
        )
    )
    return ends.sort("node"), firsts


def _chunk_ends(
    measurer: RecordMeasurer,
    records: pl.DataFrame,
    keys: pl.DataFrame,
    firsts: dict[int, list[str]],
) -> pl.DataFrame:
    pieces = measurer.pieces(records)
    text = prompt_text(pieces).cast(pl.Binary)
    start = keys["depth"].cast(pl.Int64) * measurer.chunk
    frame = keys.select("node", "depth").with_columns(
        text.bin.slice(start, measurer.chunk).alias("next")
    )
    nodes = keys["node"].to_list()
    for k in keys.with_row_index("_k").unique("node", keep="first")["_k"].to_list():
        if nodes[k] not in firsts:
            row = [p[k] for p in pieces]
            firsts[nodes[k]] = cut_pieces(row, (int(keys["depth"][k]) + 1) * measurer.chunk)
    return frame.group_by("node").agg(
        pl.col("depth").first(),
        pl.len().cast(pl.UInt32).alias("members"),
        pl.col("next").min().alias("lowest"),
        pl.col("next").max().alias("highest"),
    )
