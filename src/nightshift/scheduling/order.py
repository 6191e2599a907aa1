"""Order records so the prefix cache pays, and cut the order into shards.

Only the start of a prompt can be served from the KV cache, so records that share a
leading part (the same document asked many questions, the same few-shot block) must run
next to each other. The input to these functions is one row per runnable record:

* ``record_id`` and ``tokens`` (its prompt length);
* ``h1 .. hL``: a hash of the record's first j template segments, for each leading level
  j (``L`` is the number of placeholders minus one: the last segment is the record's own);
* ``p0 .. pL``: prompt tokens up to the end of level j (``p0``: the part every prompt
  shares, chat frame, system text and the template's leading literal).

Pure: polars frames in, polars frames out. No I/O.
"""

from __future__ import annotations

import numpy as np
import polars as pl


def level_names(levels: int) -> tuple[list[str], list[str]]:
    """The hash columns h1..hL and prefix-token columns p0..pL of ``levels`` levels."""
    return [f"h{j}" for j in range(1, levels + 1)], [f"p{j}" for j in range(levels + 1)]


def group_keys(levels: int, block_size: int) -> list[pl.Expr]:
    """g1..gL: a level's hash where that level adds at least one whole KV block of shared
    prompt, else null. Grouping on a level that adds no block gains no cache hits, so
    such records are ordered by length instead."""
    keys = []
    for j in range(1, levels + 1):
        adds_block = (pl.col(f"p{j}") // block_size) > (pl.col(f"p{j - 1}") // block_size)
        keys.append(pl.when(adds_block).then(pl.col(f"h{j}")).alias(f"g{j}"))
    return keys


def order_records(records: pl.DataFrame, levels: int, block_size: int) -> pl.DataFrame:
    """The run order: groups sharing a block-aligned prefix are adjacent, nested level by
    level; groups whose longest record is longer go first; longest first within a group;
    ties broken by id, so the order is a pure function of the records.

    Adds ``g1..gL`` and ``position`` (0-based place in the order).
    """
    frame = records.with_columns(group_keys(levels, block_size))
    if levels:
        # Levels that add no block are skipped, so the nesting is over the groups that
        # count: k1 is a record's outermost real group, k2 the next one inside it, ...
        present = pl.concat_list([f"g{j}" for j in range(1, levels + 1)]).list.drop_nulls()
        frame = frame.with_columns(
            present.list.get(i, null_on_oob=True).alias(f"_k{i + 1}") for i in range(levels)
        )
    by: list[str] = []
    descending: list[bool] = []
    for j in range(1, levels + 1):
        parents = [f"_k{i}" for i in range(1, j + 1)]
        # A record in no group at this depth (null key) is a group of its own.
        longest = pl.col("tokens").max().over(parents)
        longest = pl.when(pl.col(f"_k{j}").is_null()).then(pl.col("tokens")).otherwise(longest)
        frame = frame.with_columns(longest.alias(f"_longest{j}"))
        by += [f"_longest{j}", f"_k{j}"]
        descending += [True, False]
    by += ["tokens", "record_id"]
    descending += [True, False]
    ordered = frame.sort(by, descending=descending, nulls_last=True)
    ordered = ordered.drop([f"_{c}{j}" for j in range(1, levels + 1) for c in ("longest", "k")])
    return ordered.with_row_index("position")


def prefix_group(levels: int) -> pl.Expr:
    """The outermost block-aligned group a record belongs to (null: it shares none)."""
    if levels == 0:
        return pl.lit(None, dtype=pl.UInt64)
    return pl.coalesce([pl.col(f"g{j}") for j in range(1, levels + 1)])


class _ShardFiller:
    """Fills shards in order under a record budget and a token budget."""

    def __init__(self, max_records: int, max_tokens: int) -> None:
        self.max_records, self.max_tokens = max_records, max_tokens
        self.current, self.records, self.tokens = 0, 0, 0

    def fits(self, records: int, tokens: int) -> bool:
        return records <= self.max_records and tokens <= self.max_tokens

    def take(self, records: int, tokens: int) -> int:
        """The shard that takes this run of records, opening a new one if it is full."""
        if self.records and not self.fits(self.records + records, self.tokens + tokens):
            self.current, self.records, self.tokens = self.current + 1, 0, 0
        self.records += records
        self.tokens += tokens
        return self.current


def cut_shards(
    ordered: pl.DataFrame, levels: int, max_records: int, max_tokens: int
) -> pl.DataFrame:
    """Add ``shard``: consecutive runs of the order holding at most ``max_records``
    records and ``max_tokens`` prompt tokens. A prefix group is never split unless it
    alone exceeds a budget; then it fills shards in order."""
    group = ordered.select(prefix_group(levels).alias("g"))["g"]
    starts = (group != group.shift(1)).fill_null(True).to_numpy()  # null: a group of one
    tokens = ordered["tokens"].to_numpy().astype(np.int64)
    if not len(tokens):
        return ordered.with_columns(pl.Series("shard", [], dtype=pl.UInt32))
    begins = np.flatnonzero(starts)
    sizes = np.diff(np.append(begins, len(tokens))).tolist()
    weights = np.add.reduceat(tokens, begins).tolist()
    shard = np.zeros(len(tokens), dtype=np.uint32)
    filler = _ShardFiller(max_records, max_tokens)
    for start, size, weight in zip(begins.tolist(), sizes, weights, strict=True):
        if filler.fits(size, weight):
            shard[start : start + size] = filler.take(size, weight)
            continue
        for i in range(start, start + size):  # a group too big for any shard: fill in order
            shard[i] = filler.take(1, int(tokens[i]))
    return ordered.with_columns(pl.Series("shard", shard))
