"""The plan's first pass: every input record measured, only its keys kept.

Each input file is read once, in order, a read batch at a time; each batch is measured
(``scheduling.measure.RecordMeasurer``) in slices, and what is kept of a record is its
key row (where it is, its id, tokens; with dedup its digest), never its text. Its
chunk keys go to a file (``scheduling.chunkkeys``) under its number there, ``_seq``. An
increment skips the records an earlier plan already has.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
from tqdm.auto import tqdm

from nightshift.console import screen
from nightshift.io.inputs import READ_BATCH, file_batches
from nightshift.scheduling.chunkkeys import ChunkKeys
from nightshift.scheduling.dedup import with_digests
from nightshift.scheduling.known import KnownIds
from nightshift.scheduling.measure import RecordMeasurer

# Records measured at once, once the token estimate is calibrated (``_slices``). Each
# holds a few KB while it is measured (its pieces, text, chunks, ids): 8,192 of them, not
# a read batch of 32,768, kept 0.09 GiB off the plan's peak at a million records.
MEASURE_BATCH = 8192


def measure_input(
    dataset: ds.FileSystemDataset,
    columns: list[str],
    measurer: RecordMeasurer,
    progress: bool,
    skip: KnownIds | None,
    chunks: ChunkKeys,
    digests: bool = False,
) -> pl.DataFrame:
    """Pass over every input file once, in order, keeping only each record's keys; its
    chunk keys are added to ``chunks``, record ``_seq`` there."""
    parts = []
    bar = tqdm(
        total=dataset.count_rows(),
        desc="plan",
        unit="rec",
        file=screen(),
        disable=not progress or not screen().isatty(),  # a log gets no redrawn bar
    )
    for index in range(len(dataset.files)):
        row = 0
        for batch in file_batches(dataset, index, columns, READ_BATCH):
            for start, piece in _slices(batch, measurer):
                part = _measure_part(measurer, piece, index, row + start, skip, digests)
                if part is not None:
                    keys = part.drop_in_place("_chunks") if "_chunks" in part.columns else None
                    chunks.add(keys, part.height)
                    parts.append(part)
            row += batch.num_rows
            bar.update(batch.num_rows)
    bar.close()
    empty = {"_file": pl.UInt32, "_row": pl.UInt32, "reject_kind": pl.String}
    keys = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame(schema=empty)
    # A batch with no runnable record has no token or chunk columns: type them anyway.
    types = {"tokens": pl.Int64, "exact": pl.Boolean, "reason": pl.String}
    types |= {c: pl.Int32 for c in ("_before", "_after", "_head_bytes", "_tail_bytes")}
    types["record_id"] = pl.from_arrow(dataset.schema.empty_table())[columns[0]].dtype
    missing = [pl.lit(None, dtype=t).alias(n) for n, t in types.items() if n not in keys.columns]
    return keys.with_columns(missing).with_row_index("_seq")  # parts were added in order


def _slices(
    batch: pa.RecordBatch, measurer: RecordMeasurer
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """A read batch as slices of ``MEASURE_BATCH`` records (each with where it starts),
    once the token estimate is calibrated. Until then the batch is measured whole, as it
    always was: the estimate is calibrated on the first records of the first batch that
    has any to run, the same records whatever the slice size."""
    start = 0
    while start < batch.num_rows:
        size = batch.num_rows - start if measurer.tail is None else MEASURE_BATCH
        yield start, batch.slice(start, size)
        start += size


def _measure_part(
    measurer: RecordMeasurer,
    batch: pa.RecordBatch,
    index: int,
    row: int,
    skip: KnownIds | None,
    digests: bool,
) -> pl.DataFrame | None:
    """Key rows of ``batch``, the records of input file ``index`` from row ``row`` on
    (None: every one of them was planned before)."""
    # The input's columns and the record's place stay in two frames: any input column
    # name works, `_row` and `_file` included (DESIGN invariant 8).
    frame = pl.from_arrow(pa.Table.from_batches([batch]))
    where = pl.DataFrame(
        {
            "_file": pl.repeat(index, batch.num_rows, dtype=pl.UInt32, eager=True),
            "_row": pl.int_range(row, row + batch.num_rows, dtype=pl.UInt32, eager=True),
        }
    )
    if skip is not None:  # an increment: a null id was rejected by the first plan
        new = ~skip.contains(frame[measurer.id_column]).fill_null(True)
        frame, where = frame.filter(new), where.filter(new)
    if not frame.height:
        return None
    part = measurer.measure(frame, where)
    if digests:  # dedup: each record's exact-repeat key
        part = with_digests(part, measurer.renderer, frame, where, measurer.sampling, measurer.spec)
    return part
