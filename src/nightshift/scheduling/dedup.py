"""Find the records of a job that repeat another's prompt exactly, so each is generated once.

The key is a 96-bit BLAKE2b over the record's rendered segment texts (each prefixed by
its length in bytes). Within one job the system prompt, the template's static head and the
tokenizer are fixed (the fingerprint pins the tokenizer), and ``encode_records`` is a pure
function of (system, head, segments): equal segment texts therefore encode to the same
token ids, and the sampling and the guided-decoding constraint are the job's own, the same
for every record. Equal keys are exact repeats (a 96-bit collision aside: ``_digest``),
never near ones.

Repeats are only merged when the answer is meant to be deterministic: temperature 0, or a
fixed seed. With temperature above 0 and no seed each record is its own sample. With
``input.sampling_column`` the record's own merged sampling joins the key (two records that
differ only in it are two requests), and decides for that record whether it may merge.

The first record of a key in input order is its original; the others are its copies. The
plan orders and cuts shards over the originals only (the engine's work), then places each
copy right after its original, in its shard: a shard commits its copies with their original.
"""

from __future__ import annotations

import hashlib

import polars as pl

from nightshift.errors import RecordError
from nightshift.jobs import columns
from nightshift.jobs.sampling import SamplingColumn, deterministic, sampling_key
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import handler_for, sampling_for
from nightshift.scheduling.frames import take_rows
from nightshift.scheduling.render import Renderer

DIGEST = "_prompt_digest"
DIGEST_BYTES = 12
ANSWERED_FROM = columns.ANSWERED_FROM  # results' column too (jobs.columns: never an input's)


def dedup_applies(spec: JobSpec) -> bool:
    """Whether repeats may be answered once: the answer is deterministic. With
    ``input.sampling_column`` each record's own sampling decides (``prompt_digests``)."""
    if spec.input.sampling_column is not None:
        return True
    return deterministic(sampling_for(spec, handler_for(spec.task)))  # as the cache decides


def prompt_digests(
    renderer: Renderer,
    records: pl.DataFrame,
    sampling: SamplingColumn | None = None,
    adapter_column: str | None = None,
) -> pl.Series:
    """The exact-repeat key of every record: a digest of its prompt pieces, the very text
    the plan measures and the run encodes, and with ``sampling`` its own merged sampling
    (null for a record that cannot run or whose own sampling is not deterministic)."""
    bad = renderer.problems(records)["reject_kind"].is_not_null()
    own = _own_sampling(records, sampling)
    bad = bad | own.is_null() if own is not None else bad
    if bad.all():
        return pl.Series(DIGEST, [None] * records.height, dtype=pl.Binary)
    pieces = [p.to_list() for p in renderer.pieces(records.filter(~bad))]
    if own is not None:  # the same prompt under other settings is another request
        pieces.append(own.filter(~bad).to_list())
    if adapter_column is not None:  # ... and under another adapter (null: the base)
        pieces.append([adapter_piece(a) for a in records.filter(~bad)[adapter_column].to_list()])
    digests = iter([_digest(parts) for parts in zip(*pieces, strict=True)])
    return pl.Series(DIGEST, [None if b else next(digests) for b in bad.to_list()], dtype=pl.Binary)


def adapter_piece(adapter: str | None) -> str:
    """What a record's adapter adds to its key: ``adapter:NAME``, or for the base model
    (null) a piece no adapter's name makes (an adapter may be called "None")."""
    return "base model" if adapter is None else f"adapter:{adapter}"


def _own_sampling(records: pl.DataFrame, sampling: SamplingColumn | None) -> pl.Series | None:
    """Each record's merged sampling as canonical JSON; null where it is bad (the plan
    rejects it) or not deterministic (each such record is its own sample)."""
    if sampling is None:
        return None
    keys = []
    for value in records[sampling.column].to_list():
        try:
            merged = sampling.sampling(value)
        except RecordError:
            merged = None
        keys.append(sampling_key(merged) if merged and deterministic(merged) else None)
    return pl.Series(keys, dtype=pl.String)


def _digest(parts: tuple[str, ...]) -> bytes:
    # 12 bytes: polars keeps a binary value of up to 12 bytes inside its 16-byte view, so
    # a million digests hold 16 MB, not the 48 MB a 32-byte one costs. 96 bits: two of a
    # billion distinct prompts share one with odds of about 1 in 10^11.
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))  # no two splits of one text hash alike
        h.update(data)
    return h.digest()


def split_copies(runnable: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(originals, copies): copies carry ``answered_from``, their original's record_id.
    Takes ``runnable``: do not use it afterwards (where it holds copies its rows are
    moved out of it, ``scheduling.frames``: a plan's key frame is not held twice)."""
    none = pl.lit(None, dtype=runnable.schema["record_id"]).alias(ANSWERED_FROM)
    if DIGEST not in runnable.columns:  # repeats are not merged in this job
        return runnable.with_columns(none), runnable.head(0).with_columns(none)
    # The first in input order is the original; the measurement's keys come in that
    # order already, and a frame of a million records is not copied for nothing.
    frame = runnable
    if not _in_input_order(runnable):
        frame = take_rows(runnable, runnable.select(pl.arg_sort_by("_file", "_row")).to_series())
    first = frame.select(pl.col(DIGEST).is_first_distinct() | pl.col(DIGEST).is_null()).to_series()
    if first.all():  # no repeats: the originals are the frame itself
        return frame.drop(DIGEST).with_columns(none), frame.head(0).drop(DIGEST).with_columns(none)
    copies = frame.filter(~first)
    originals = take_rows(frame, first)
    # Only the originals that have copies are looked up: a join against every original
    # hashes them all, and was the plan's peak at a million records.
    lookup = originals.select(DIGEST, pl.col("record_id").alias(ANSWERED_FROM))
    lookup = lookup.filter(pl.col(DIGEST).is_in(copies[DIGEST].unique().implode()))
    copies = copies.join(lookup, on=DIGEST, how="left")
    return originals.drop(DIGEST).with_columns(none), copies.drop(DIGEST)


def _in_input_order(frame: pl.DataFrame) -> bool:
    place = frame.select(pl.col("_file").cast(pl.Int64) * (1 << 32) + pl.col("_row")).to_series()
    return place.is_sorted()


def place_copies(ordered: pl.DataFrame, copies: pl.DataFrame) -> pl.DataFrame:
    """The plan's records with each copy right after its original, in its shard, and
    positions numbered again in that order. Copies send nothing: no cached tokens."""
    if not copies.height:
        return ordered
    # Copies still carry the measurement's working columns (scheduling.measure: one of
    # them was called "_after", and the copies were once sorted by it instead of by
    # their original's position). They keep only what the records have.
    copies = copies.select([c for c in copies.columns if c in ordered.columns])
    at = "_original_position"
    where = ordered.select(
        pl.col("record_id").alias(ANSWERED_FROM), "shard", pl.col("position").alias(at)
    )
    placed = copies.join(where, on=ANSWERED_FROM, how="left").with_columns(
        pl.lit(0, dtype=ordered.schema["predicted_cached"]).alias("predicted_cached")
    )
    mine = ordered.with_columns(pl.col("position").alias(at))
    both = pl.concat(
        [
            mine.with_columns(pl.lit(0).alias("_copy")),
            placed.with_columns(pl.lit(1).alias("_copy")),
        ],
        how="diagonal_relaxed",
    )
    both = both.sort(at, "_copy", "_file", "_row").drop(at, "_copy", "position")
    return both.with_row_index("position")


def repeats_summary(records: pl.DataFrame) -> dict[str, int]:
    """The plan's count of copies and the prompt tokens they do not send."""
    if ANSWERED_FROM not in records.columns:
        return {"copies": 0, "prompt_tokens_not_sent": 0}
    copies = records.filter(pl.col(ANSWERED_FROM).is_not_null())
    return {
        "copies": copies.height,
        "prompt_tokens_not_sent": int(copies["tokens"].sum() or 0),
    }


def distinct_records(records: pl.DataFrame) -> pl.DataFrame:
    """The records the engine is sent: originals only."""
    if ANSWERED_FROM not in records.columns:
        return records
    return records.filter(pl.col(ANSWERED_FROM).is_null())


def with_digests(
    keys: pl.DataFrame,
    renderer: Renderer,
    records: pl.DataFrame,
    where: pl.DataFrame,
    sampling: SamplingColumn | None = None,
    spec: JobSpec | None = None,
) -> pl.DataFrame:
    """``keys`` (one input batch's plan keys) with each record's exact-repeat key."""
    column = spec.input.adapter_column if spec is not None else None
    digests = where.with_columns(prompt_digests(renderer, records, sampling, column))
    return keys.join(digests, on=["_file", "_row"], how="left")
