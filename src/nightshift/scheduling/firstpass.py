"""The plan's first pass: every input record measured, only its keys kept.

Each input file is read once, in order, a read batch at a time; each batch is measured
(``scheduling.measure.RecordMeasurer``) in slices, and what is kept of a record is its
key row (where it is, its id, tokens; with dedup its digest), never its text. Its
chunk keys go to a file (``scheduling.chunkkeys``) under its number there, ``_seq``. An
increment skips the records an earlier plan already has.

A first plan hands slices to helper processes where the run lends it some
(``scheduling.helpers``): a helper measures a slice exactly as this process would, with
the token estimate this process calibrated on the first records, and the parts are
kept in input order whoever measured them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
from tqdm.auto import tqdm

from nightshift.console import screen
from nightshift.io.inputs import READ_BATCH, file_batches
from nightshift.scheduling.budget import TailEstimate
from nightshift.scheduling.chunkkeys import ChunkKeys
from nightshift.scheduling.dedup import with_digests
from nightshift.scheduling.helpers import Helpers, InOrder
from nightshift.scheduling.known import KnownIds
from nightshift.scheduling.measure import RecordMeasurer

# Records measured at once, once the token estimate is calibrated (``_slices``). Each
# holds a few KB while it is measured (its pieces, text, chunks, ids): 8,192 of them, not
# a read batch of 32,768, kept 0.09 GiB off the plan's peak at a million records.
MEASURE_BATCH = 8192

Where = tuple[int, int]  # a slice's input file and its first row there
# A slice's key rows (None: every record was planned before), and the smallest and
# largest leading chunk its measurer saw (``RecordMeasurer.seen_start``).
Part = tuple[pl.DataFrame | None, bytes | None, bytes | None]


@dataclass(frozen=True)
class MeasureSlice:
    """A helper's job: a slice of input measured as the plan measures it, with the token
    estimate the plan calibrated on its first records (every slice is estimated alike)."""

    block_size: int
    tail: TailEstimate
    digests: bool  # dedup: each record's exact-repeat key too
    at: Where
    records: pl.DataFrame

    def run(self, measurer: RecordMeasurer) -> Part:
        measurer.tail = self.tail
        measurer.seen_start()  # only this slice's start goes back
        part = _measure_part(measurer, self.records, *self.at, None, self.digests)
        return (part, *measurer.seen_start())


def measure_input(
    dataset: ds.FileSystemDataset,
    columns: list[str],
    measurer: RecordMeasurer,
    progress: bool,
    skip: KnownIds | None,
    chunks: ChunkKeys,
    digests: bool = False,
    helpers: Helpers | None = None,
) -> pl.DataFrame:
    """Pass over every input file once, in order, keeping only each record's keys; its
    chunk keys are added to ``chunks``, record ``_seq`` there. ``helpers`` measure
    slices of a first plan beside this process (an increment's are all measured here)."""
    first = _FirstPass(measurer, chunks, skip, digests)
    order = InOrder(helpers if skip is None else None, first.keep)
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
                first.add(order, pl.from_arrow(piece), (index, row + start))
            row += batch.num_rows
            bar.update(batch.num_rows)
    order.finish()
    bar.close()
    empty = {"_file": pl.UInt32, "_row": pl.UInt32, "reject_kind": pl.String}
    parts = first.parts
    keys = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame(schema=empty)
    # A batch with no runnable record has no token or chunk columns: type them anyway.
    types = {"tokens": pl.Int64, "exact": pl.Boolean, "reason": pl.String}
    types |= {c: pl.Int32 for c in ("_before", "_after", "_head_bytes", "_tail_bytes")}
    types["record_id"] = pl.from_arrow(dataset.schema.empty_table())[columns[0]].dtype
    missing = [pl.lit(None, dtype=t).alias(n) for n, t in types.items() if n not in keys.columns]
    return keys.with_columns(missing).with_row_index("_seq")  # parts were added in order


class _FirstPass:
    """The parts measured so far, in input order, whoever measured them."""

    def __init__(
        self, measurer: RecordMeasurer, chunks: ChunkKeys, skip: KnownIds | None, digests: bool
    ) -> None:
        self.measurer, self.chunks, self.skip, self.digests = measurer, chunks, skip, digests
        self.parts: list[pl.DataFrame] = []

    def add(self, order: InOrder, records: pl.DataFrame, at: Where) -> None:
        """``records`` measured by a helper once the token estimate is calibrated (the
        first records calibrate it, here), else here."""
        measurer, job = self.measurer, None
        if measurer.tail is not None:
            job = MeasureSlice(measurer.block_size, measurer.tail, self.digests, at, records)

        def here() -> Part:
            return _measure_part(measurer, records, *at, self.skip, self.digests), None, None

        order.add(job, here)

    def keep(self, measured: Part, by_helper: bool) -> None:
        keys, lowest, highest = measured
        if by_helper:  # what it saw joins what this measurer saw
            self.measurer.merge_start(lowest, highest)
            self.measurer.exact_records += _exact_records(keys)
        if keys is not None:
            chunk_keys = keys.drop_in_place("_chunks") if "_chunks" in keys.columns else None
            self.chunks.add(chunk_keys, keys.height)
            self.parts.append(keys)


def _exact_records(keys: pl.DataFrame | None) -> int:
    """Records whose tokens were counted, in a helper's part (as ``RecordMeasurer``
    counts its own)."""
    if keys is None or "exact" not in keys.columns:
        return 0
    return int(keys["exact"].sum() or 0)


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
    frame: pl.DataFrame,
    index: int,
    row: int,
    skip: KnownIds | None,
    digests: bool,
) -> pl.DataFrame | None:
    """Key rows of ``frame``, the records of input file ``index`` from row ``row`` on
    (None: every one of them was planned before)."""
    # The input's columns and the record's place stay in two frames: any input column
    # name works, `_row` and `_file` included (DESIGN invariant 8).
    where = pl.DataFrame(
        {
            "_file": pl.repeat(index, frame.height, dtype=pl.UInt32, eager=True),
            "_row": pl.int_range(row, row + frame.height, dtype=pl.UInt32, eager=True),
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
