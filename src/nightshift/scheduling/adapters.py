"""The plan's side of per-record LoRA adapters (``input.adapter_column``).

A record's adapter decides its answer and its cache: vLLM's prefix cache never serves a
block computed under one adapter to a request under another (its block keys hold the
adapter), and switching adapters in a batch costs. So each record's prefix keys are
salted with its adapter (``salted``): records of two adapters never share a prefix
group, the reuse prediction counts no hit across adapters, and the run order walks one
adapter's records (by shared prefix, longest first) before the next adapter's. An
unknown name rejects its record (``unknown_adapter``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pyarrow as pa

from nightshift.jobs.spec import JobSpec

ADAPTER = "_adapter"  # the plan keys' column: each record's adapter name (null: base)


def adapter_problems(spec: JobSpec, batch: pl.DataFrame) -> list[tuple[str | None, str | None]]:
    """(reject_kind, reason) per record: a name not in model.adapters is refused."""
    column = spec.input.adapter_column
    if column is None:
        return [(None, None)] * batch.height
    known = spec.model.adapters
    names = ", ".join(sorted(known))
    return [
        (None, None)
        if name is None or name in known
        else ("unknown_adapter", f"{column}: adapter {name!r} is not in model.adapters ({names})")
        for name in batch[column].to_list()
    ]


def salted(chunks: pl.Series, adapters: pl.Series) -> pl.Series:
    """Each record's prefix keys moved by a constant of its adapter (base: unmoved), so
    equal keys still mean equal leading bytes, now under the same adapter too."""
    salts = np.array([_salt(a) for a in adapters.to_list()], dtype=np.uint64)
    if not salts.any():
        return chunks
    lists = chunks.to_arrow()
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    offsets = lists.offsets.to_numpy()
    values = lists.values.to_numpy(zero_copy_only=False).astype(np.uint64)
    with np.errstate(over="ignore"):
        moved = values + np.repeat(salts, np.diff(offsets))  # wraps modulo 2**64
    rebuilt = type(lists).from_arrays(pa.array(offsets), pa.array(moved, type=pa.uint64()))
    return pl.Series(chunks.name, rebuilt)


def _salt(adapter: str | None) -> int:
    if adapter is None:
        return 0
    return int.from_bytes(hashlib.sha256(adapter.encode()).digest()[:8], "little")
