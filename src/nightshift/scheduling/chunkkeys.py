"""Every measured record's chunk keys (``sharing.chunk_keys``), kept in a file, not in memory.

The keys were most of a plan's memory: 13 keys of 8 bytes a short ticket, 109 of the key
frame's 162 bytes a record, and at a million records the plan's peak grew with them. They
are only read to find how far each prompt shares its start (``sharing.depth_of``),
which looks at one level of keys at a time, and only for the prompts still sharing. So
the first pass appends each measured slice's keys to a temporary Arrow file, record n
being the n-th added, and ``depth_of`` reads back a window of levels at a time for the
records it still needs (``gather``): memory holds a window, never every key.

The file lives in the system's temporary folder (``TMPDIR``), about 110 MB a million short
records, and has no name there: it is gone when the plan is built, and when its process
ends however it ends (a kill leaves nothing behind to fill the disk).
"""

from __future__ import annotations

import tempfile

import numpy as np
import polars as pl
import pyarrow as pa


class ChunkKeys:
    """Records' chunk-key lists, appended slice by slice, read back by record number."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="nightshift-chunks-")  # noqa: SIM115 (closed by close)
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._reader: pa.ipc.RecordBatchFileReader | None = None
        self._firsts = [0]  # record number of each slice's first record, and the end
        self._counts: list[np.ndarray] = []
        self._all_counts: np.ndarray | None = None

    def __enter__(self) -> ChunkKeys:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    @classmethod
    def of(cls, lists: pl.Series) -> ChunkKeys:
        keys = cls()
        keys.add(lists)
        return keys

    @property
    def records(self) -> int:
        return self._firsts[-1]

    def add(self, lists: pl.Series | None, records: int | None = None) -> None:
        """Append one slice's key lists (None: ``records`` records without keys)."""
        if self._reader is not None:
            raise RuntimeError("chunk keys are added before any is read back")
        if lists is None:
            lists = pl.Series([None] * (records or 0), dtype=pl.List(pl.UInt64))
        array = lists.cast(pl.List(pl.UInt64)).rechunk().to_arrow()
        batch = pa.record_batch([array], names=["keys"])
        if self._writer is None:
            self._writer = pa.ipc.new_file(pa.PythonFile(self._file, mode="w"), batch.schema)
        self._writer.write_batch(batch)
        self._counts.append(lists.list.len().fill_null(0).to_numpy().astype(np.uint32))
        self._firsts.append(self._firsts[-1] + len(lists))
        self._all_counts = None

    def counts(self) -> np.ndarray:
        """Each record's number of keys, by record number."""
        if self._all_counts is None:
            self._all_counts = np.concatenate([np.zeros(0, np.uint32), *self._counts])
            self._counts = [self._all_counts]  # held once
        return self._all_counts

    def gather(
        self, records: np.ndarray, level: int, width: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """For ``records`` (record numbers, ascending): how many keys each has from
        ``level`` on, at most ``width`` (None: all), and those keys laid end to end. Only
        the slices that hold one of ``records`` are read, each straight into its place."""
        if len(records) > 1 and not (np.diff(records) > 0).all():
            raise ValueError("gather takes record numbers in ascending order")
        left = np.maximum(self.counts()[records].astype(np.int64) - level, 0)
        takes = np.minimum(left, width) if width is not None else left
        values = np.empty(int(takes.sum()), dtype=np.uint64)
        bounds = np.searchsorted(records, self._firsts)
        placed = np.cumsum(takes) - takes  # where each record's keys go in ``values``
        for index in np.flatnonzero(np.diff(bounds)):
            lo, hi = bounds[index], bounds[index + 1]
            lists = self._slice(int(index))
            offsets = lists.offsets.to_numpy(zero_copy_only=False)
            start, end = placed[lo], placed[hi - 1] + takes[hi - 1]
            # each key's place in this slice's values, laid out as they go into ``values``
            read_from = offsets[records[lo:hi] - self._firsts[index]] + level
            at = np.arange(end - start, dtype=np.int64)
            at += np.repeat(read_from - (placed[lo:hi] - start), takes[lo:hi])
            values[start:end] = lists.values.to_numpy(zero_copy_only=False)[at]
        return takes, values

    def _slice(self, index: int) -> pa.LargeListArray:
        if self._reader is None:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._file.seek(0)  # read slice by slice: only what is read is held
            self._reader = pa.ipc.open_file(pa.PythonFile(self._file, mode="r"))
        return self._reader.get_batch(index).column(0)

    def close(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            self._writer = self._reader = None
            self._file.close()
