"""The records ``jobs tune`` runs: a sample of the job's own input, laid out as the plan
lays the whole job out.

The plan orders records so that those sharing a prompt prefix run together; a sample of
scattered records would share nothing and show a prefix cache the full job never has.
So the sample is a few runs of consecutive records in plan order (windows spread over the
plan, whole prefix groups but for a window's two ends), written as one Parquet file the
candidates read as their input.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from nightshift.io.inputs import write_records
from nightshift.jobs.spec import JobSpec
from nightshift.scheduling.plan import build_plan, load_encoder

WINDOWS = 4  # runs of consecutive records in plan order
SHARE = 0.05  # of the job's records, by default ...
# ... within these bounds. A small sample batches less and shares less prefix cache than
# the job, so its share of the job's time runs above its share of records (measured on
# the demo: 8% of records cost 10-15% of the generation time); 5% keeps it under 10%.
SMALLEST, LARGEST = 16, 2000


def default_size(records: int) -> int:
    """A small share of the job: every candidate runs it, so the tune stays a fraction
    of the job's time (at most a tenth of its records where the job is small)."""
    size = min(LARGEST, max(SMALLEST, round(records * SHARE)))
    return max(1, min(size, records // 10 if records >= 10 * SMALLEST else records))


def sample_ids(spec: JobSpec, size: int | None) -> tuple[list, int]:
    """The sample's record ids in plan order, and the job's runnable record count."""
    plan = build_plan(spec, load_encoder(spec), progress=False)
    order = plan.records.filter(pl.col("record_id").is_not_null()).sort("position")
    total = order.height
    size = min(total, size or default_size(total))
    windows = min(WINDOWS, size)
    each, ids = -(-size // windows), []
    for w in range(windows):
        start = (total - each) * w // max(1, windows - 1) if windows > 1 else 0
        ids += order["record_id"][max(0, start) : max(0, start) + each].to_list()
    return list(dict.fromkeys(ids))[:size], total


def write_sample(spec: JobSpec, ids: list, path: Path) -> Path:
    """The input rows of ``ids`` as one Parquet file at ``path``."""
    return write_records(spec.input.path, spec.input.id_column, ids, path, spec.output.path)
