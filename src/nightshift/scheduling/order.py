"""Order records so the prefix cache pays, and cut the order into shards.

Only the start of a prompt can be served from the KV cache, and only in whole KV blocks,
so records that share a block-aligned start of their token sequence must run next to
each other, wherever that start ends: after a template field, inside one, or anywhere in
a conversation. The input to these functions is one row per runnable record:

* ``record_id`` and ``tokens`` (its prompt length);
* ``blocks``: a key per whole KV block of the leading part of its token ids that other
  records may share, each covering every block before it (as vLLM's block hashes do).

The records and their blocks form a trie; ``prefix_levels`` names the nodes that count:
a node is a group where fewer records pass through it than through its parent (a chain
of blocks that the same records share is one group), so each record has a few levels:

* ``h1 .. hL``: its groups, outermost first (null past its last);
* ``p0 .. pL``: prompt tokens, in whole blocks, that level j's group shares (``p0``:
  what every record shares, such as the system text).

The run order is a depth-first walk of that trie. Today's template fields are one case
of it: a document shared by many questions is a chain of blocks that one group shares.

Pure: polars frames in, polars frames out. No I/O.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nightshift.scheduling.adapters import ADAPTER
from nightshift.scheduling.frames import attach, take_rows


def level_names(levels: int) -> tuple[list[str], list[str]]:
    """The hash columns h1..hL and prefix-token columns p0..pL of ``levels`` levels."""
    return [f"h{j}" for j in range(1, levels + 1)], [f"p{j}" for j in range(levels + 1)]


def level_count(frame: pl.DataFrame) -> int:
    """How many levels ``prefix_levels`` gave ``frame``."""
    levels = 0
    while f"h{levels + 1}" in frame.columns:
        levels += 1
    return levels


LEAF = "_leaf"  # a record's last shared block key: records with the same one share all


def leaves_of(records: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``records`` with each one's ``_leaf`` (from its own ``blocks``), and each leaf's
    blocks (``_leaf``, ``blocks``): the form ``prefix_levels`` works on."""
    records = records.with_columns(pl.col("blocks").list.last().alias(LEAF))
    leaves = records.select(LEAF, "blocks").filter(pl.col(LEAF).is_not_null())
    return records, leaves.unique(LEAF)  # a leaf covers every block before it: one list


def _trie(records: pl.DataFrame, leaves: pl.DataFrame) -> pl.DataFrame:
    """One row per (leaf, depth) of the records' block paths that two or more records
    share, with how many records pass through that node and through its parent."""
    counts = records.group_by(LEAF).agg(pl.len().alias("_n"))
    leaves = leaves.join(counts, on=LEAF).select(LEAF, "_n", "blocks")
    nodes = leaves.with_columns(
        pl.int_ranges(1, pl.col("blocks").list.len() + 1, dtype=pl.UInt32).alias("_d")
    ).explode(["blocks", "_d"])
    counts = nodes.group_by("blocks").agg(pl.col("_n").sum().alias("_count"))
    nodes = nodes.join(counts, on="blocks").sort("_leaf", "_d")
    parent = pl.col("_count").shift(1).over("_leaf").fill_null(records.height)
    return nodes.with_columns(parent.alias("_parent")).filter(pl.col("_count") >= 2)


def prefix_levels(
    records: pl.DataFrame, block_size: int, leaves: pl.DataFrame | None = None
) -> pl.DataFrame:
    """``records`` with ``p0``, ``h1..hL`` and ``p1..pL`` (see the module docstring).
    Each record's shared blocks are its own ``blocks``, or, where ``leaves`` is given,
    its ``_leaf``'s there: a plan keeps one list for all the records that share it (a
    list a record was 80 bytes of a million tickets' plan, the same few lists over)."""
    if leaves is None:
        records, leaves = leaves_of(records)
    nodes = _trie(records, leaves)
    # Level j of a path starts where its count drops; the level ends at the deepest
    # node before the next drop (the chain of blocks one group shares).
    nodes = nodes.with_columns(
        (pl.col("_count") < pl.col("_parent")).cum_sum().over("_leaf").alias("_j")
    )
    root = nodes.filter(pl.col("_j") == 0)["_d"].max()
    p0 = pl.lit(int(root or 0) * block_size, dtype=pl.Int64).alias("p0")
    levels = (
        nodes.filter(pl.col("_j") > 0)
        .group_by("_leaf", "_j")
        .agg(
            pl.col("blocks").sort_by("_d").first().alias("h"),
            (pl.col("_d").max() * block_size).alias("p"),
        )
    )
    count = int(levels["_j"].max() or 0)
    frame = records.with_columns(p0)
    if count:
        wide = levels.pivot(on="_j", index="_leaf", values=["h", "p"], sort_columns=True)
        names = {f"{c}_{j}": f"{c}{j}" for c in "hp" for j in range(1, count + 1)}
        wide = wide.rename({k: v for k, v in names.items() if k in wide.columns})
        columns = [
            pl.col(f"{c}{j}").cast(pl.UInt64 if c == "h" else pl.Int64)
            for j in range(1, count + 1)
            for c in "hp"
        ]
        frame = attach(frame, wide.select("_leaf", *columns), "_leaf")
        frame = frame.select(
            *(c for c in frame.columns if c not in names.values()),
            *(f"{c}{j}" for j in range(1, count + 1) for c in "hp"),
        )
    return frame.drop("_leaf")


def order_records(records: pl.DataFrame, block_size: int) -> pl.DataFrame:
    """The run order: a depth-first walk of the prefix trie. Siblings (groups, and
    records in no deeper group) go longest first, by the longest record each holds, so
    long prompts start early; ties are broken by group key, then by id, so the order is
    a pure function of the records.

    Adds the levels (``prefix_levels``, unless present) and ``position``. Takes
    ``records``: do not use it afterwards (when it has its levels its rows are moved
    into the order, ``scheduling.frames``, so the plan's records are not held twice).
    """
    frame = records if "p0" in records.columns else prefix_levels(records, block_size)
    return take_rows(frame, _run_order(frame)).with_row_index("position")


def _run_order(frame: pl.DataFrame) -> pl.Series:
    """Row numbers of ``frame`` in run order: by each level's group, longest first, then
    by tokens and id. Sorted key by key from the least significant, each sort stable: one
    sort by every key at once held them all row-encoded for every row (0.45 GiB over the
    plan's peak at 3,000,000 records); one key at a time holds one."""
    order = None
    for columns, by, descending in reversed(_sort_keys(frame)):
        view = frame.select(columns)
        view = view if order is None else view.select(pl.all().gather(order))
        at = view.select(
            pl.arg_sort_by(by, descending=descending, nulls_last=True, maintain_order=True)
        ).to_series()
        order = at if order is None else order.gather(at)
    return order if order is not None else pl.Series([], dtype=pl.UInt32)


def _sort_keys(frame: pl.DataFrame) -> list[tuple[list[str], list[pl.Expr], list[bool]]]:
    """The run order's keys, most significant first: the columns each reads, the key
    and its directions."""
    keys: list[tuple[list[str], list[pl.Expr], list[bool]]] = []
    if ADAPTER in frame.columns:  # one adapter's records, then the next's (base last)
        keys.append(([ADAPTER], [pl.col(ADAPTER)], [False]))
    for j in range(1, level_count(frame) + 1):
        # A record in no group at this depth is a sibling of its own length.
        group = pl.col(f"h{j}")
        longest = pl.when(group.is_null()).then(pl.col("tokens"))
        longest = longest.otherwise(pl.col("tokens").max().over(group))
        keys.append((["tokens", f"h{j}"], [longest, group], [True, False]))
    keys.append((["tokens", "record_id"], [pl.col("tokens"), pl.col("record_id")], [True, False]))
    return keys


def prefix_group(levels: int) -> pl.Expr:
    """The outermost group a record belongs to (null: it shares no block with a group)."""
    if levels == 0:
        return pl.lit(None, dtype=pl.UInt64)
    return pl.coalesce([pl.col(f"h{j}") for j in range(1, levels + 1)])


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


def cut_shards(ordered: pl.DataFrame, max_records: int, max_tokens: int) -> pl.DataFrame:
    """Add ``shard``: consecutive runs of the order holding at most ``max_records``
    records and ``max_tokens`` prompt tokens. A prefix group is never split unless it
    alone exceeds a budget; then it fills shards in order (one engine runs them one
    after the other, so the group still runs back to back)."""
    group = ordered.select(prefix_group(level_count(ordered)).alias("g"))["g"]
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
