"""The ids an output has already planned, looked up batch by batch.

An increment checks every input batch against all ids planned before. Sorting them once
makes each batch a binary search, O(batch * log known), where a fresh hash set per
batch cost O(known) for every batch: quadratic over a growing nightly input.
"""

from __future__ import annotations

import polars as pl


class KnownIds:
    """Ids planned by earlier increments (runnable or rejected), sorted once."""

    def __init__(self, ids: pl.Series) -> None:
        self.ids = ids.drop_nulls().sort()

    def __len__(self) -> int:
        return self.ids.len()

    def contains(self, ids: pl.Series) -> pl.Series:
        """Per id, whether it is known; null where the id is null."""
        if not len(self) or ids.dtype != self.ids.dtype:
            # A different id type is a changed input: nothing matches, and the increment's
            # schema check names the change.
            return pl.Series(ids.name, [False] * ids.len(), dtype=pl.Boolean).zip_with(
                ids.is_not_null(), pl.Series([None] * ids.len(), dtype=pl.Boolean)
            )
        at = self.ids.search_sorted(ids, side="left").clip(upper_bound=len(self) - 1)
        return (self.ids.gather(at) == ids).alias(ids.name)
