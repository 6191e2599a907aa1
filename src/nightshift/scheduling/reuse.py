"""Predict how many prompt tokens the prefix cache will serve in a given order.

The model follows vLLM's prefix cache: a prompt reuses the longest prefix already in
the cache, in whole KV blocks, and always computes at least its last token. A shared
prefix is taken to be in the cache when a record with the same prefix ran at most
``window`` records earlier (the cache holds about ``window`` prompts' worth of blocks);
the part every prompt shares (``p0``) is always hot. Prefixes are the levels of
``scheduling.order.prefix_levels``: any record of a group shares the group's blocks.
Records in different partitions (shards, which may run on different engines) share
nothing.

Pure: polars frames in, polars expressions and numbers out.
"""

from __future__ import annotations

import polars as pl

from nightshift.scheduling.order import level_count, level_names


def predicted_cached(
    frame: pl.DataFrame, block_size: int, window: int, by: str | None = None
) -> pl.Series:
    """Prompt tokens served from cache for each record, running in ``frame``'s row order.

    ``frame`` has ``tokens``, ``h1..hL`` and ``p0..pL`` (``scheduling.order.prefix_levels``).
    """
    hashes, prefixes = level_names(level_count(frame))
    partition = [by] if by else []
    frame = frame.with_row_index("_at")
    position = pl.col("_at").cast(pl.Int64)
    first = position.shift(1).over(partition) if partition else position.shift(1)
    reusable = pl.when(first.is_not_null()).then(pl.col("p0")).otherwise(0)
    for h, p in zip(hashes, prefixes[1:], strict=True):
        previous = position.shift(1).over([*partition, h])
        hot = ((position - previous) <= window) & pl.col(h).is_not_null()
        reusable = pl.when(hot.fill_null(False)).then(pl.col(p)).otherwise(reusable)
    capped = pl.min_horizontal(reusable, pl.col("tokens") - 1).clip(lower_bound=0)
    cached = (capped // block_size) * block_size
    return frame.select(cached.cast(pl.Int64).alias("predicted_cached"))["predicted_cached"]


def reuse_share(cached: pl.Series, tokens: pl.Series) -> float:
    """Cached prompt tokens as a share of all prompt tokens (0 for no tokens)."""
    total = int(tokens.sum())
    return int(cached.sum()) / total if total else 0.0
