"""Whole-frame steps that move a plan's key frame instead of copying it.

The key frame (about 160 bytes a record: the chunk keys, the measuring columns, the
digest) is the largest thing a plan holds. A polars filter or join of the whole frame
holds it twice, and the caller's name for the input keeps the old copy alive until the
step returns: at a million records that was the plan's peak, 0.3-0.4 GiB over the rest.

``take_rows`` moves the columns out of the frame it is given, one at a time, so at most
one column is held twice; the frame passed in is left with no columns. ``attach`` adds a
small table's columns by a key without copying the frame's own.
"""

from __future__ import annotations

import polars as pl

_AT = "_attach_row"


def take_rows(frame: pl.DataFrame, rows: pl.Series) -> pl.DataFrame:
    """``frame``'s rows where ``rows`` is true (a Boolean mask), or at ``rows`` (row
    numbers), in a new frame; ``frame`` is left with no columns."""
    pick = pl.Series.filter if rows.dtype == pl.Boolean else pl.Series.gather
    moved = [pick(frame.drop_in_place(name), rows) for name in frame.columns]
    return pl.DataFrame(moved)


def attach(frame: pl.DataFrame, table: pl.DataFrame, on: str) -> pl.DataFrame:
    """``frame`` with ``table``'s other columns, matched by ``on`` (unique in ``table``;
    null where a row has no match): a left join that gathers only ``table``'s columns."""
    keys = table.select(on).with_row_index(_AT)
    at = frame.select(on).join(keys, on=on, how="left", maintain_order="left")[_AT]
    return frame.with_columns(table.drop(on).select(pl.all().gather(at)))
