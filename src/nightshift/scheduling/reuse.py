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


NONE_SHARE = 0.005  # below this a prediction reads as 0.0%


def reuse_note(reuse: dict) -> str | None:
    """Why the prefix cache will serve (almost) nothing although prompts share a start:
    the start is shorter than one KV block, and vLLM reuses whole blocks only. None when
    reuse is predicted, or no start is shared (or an older plan did not measure it)."""
    shared, block = reuse.get("shared_start_tokens") or 0, reuse.get("block_size") or 0
    if reuse.get("predicted", 0.0) >= NONE_SHARE or not 0 < shared < block:
        return None
    return (
        f"the prompts share at most their first {shared:,} tokens (the system prompt and "
        f"chat frame), less than one {block:,}-token KV block, and the prefix cache reuses "
        f"whole blocks only; to reuse them, put at least {block - shared:,} more tokens of "
        "fixed text before each record's own (fuller instructions, examples), or run where "
        "KV blocks are smaller (engine.block_size; 16 tokens on GPUs)"
    )
