"""A job's output location (local directory or S3 prefix) and what nightshift keeps there.

Layout (every Parquet file readable by polars, pyarrow and DuckDB)::

    OUTPUT/plan/                  the plan, written before generation (io.planstore)
    OUTPUT/rejects.parquet        records that could not run, with ``reason``
    OUTPUT/committed/             one commit marker per finished shard (io.shardstore)
    OUTPUT/results/               committed shards' answers, one file per shard
    OUTPUT/failed/                committed shards' failed records, with ``error``
    OUTPUT/_work/                 checkpoints of shards still running, workers' figures
    OUTPUT/leases/                which worker holds which shard (io.leases)
    OUTPUT/rejects-0001.parquet   rejects of later increments (records new since)
    OUTPUT/report.json            counts, tokens, times, throughput, cost; rewritten by
                                  every run into this output
    OUTPUT/report.md, report.png  the same report for people, with its chart

Only the keys under these names are nightshift's: anything else in the output location
is never read, replaced or deleted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nightshift.errors import ObjectNotFound, OutputExistsError, SpecError
from nightshift.io.leases import LEASES
from nightshift.io.objectstore import ObjectStore, open_store
from nightshift.io.planstore import PLAN_DIR, REJECTS, PlanStore
from nightshift.io.shardstore import COMMITTED, WORK, ShardStore

REPORT_FILE = "report.json"
REPORT_PAGE = "report.md"  # the same figures for people, with the chart
REPORT_CHART = "report.png"


class JobOutput:
    """One output location: its plan, its shards and its report."""

    def __init__(self, location: str) -> None:
        if not location.startswith("s3://") and Path(location).expanduser().is_file():
            raise SpecError("output.path", f"{location} is a file", "give a directory")
        self.location = location
        self.store: ObjectStore = open_store(location)
        self.plans = PlanStore(self.store)
        self.shards = ShardStore(self.store)

    def report(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.store.get_bytes(REPORT_FILE))
        except ObjectNotFound:
            return None

    def holds_a_run(self) -> bool:
        """Whether an earlier run (finished, partial, or from an older nightshift) is here."""
        return bool(
            self.plans.manifest() is not None
            or self.store.exists(REPORT_FILE)
            or self.store.list(f"{COMMITTED}/")
            or self.shards.data_files()
        )

    def clear(self) -> None:
        """Delete every key nightshift owns here (for --overwrite), markers first, so a
        reader never sees a marker whose files are gone."""
        for folder in (COMMITTED, PLAN_DIR, WORK, LEASES):
            self.store.delete(self.store.list(f"{folder}/"))
        manifest = self.plans.manifest() or {}
        rejects = manifest.get("rejects_files", [REJECTS])
        reports = [REPORT_FILE, REPORT_PAGE, REPORT_CHART]
        self.store.delete(self.shards.data_files() + rejects + reports)


def committed_files(location: str, kind: str = "results") -> list[str]:
    """The files a reader should open: those the commit markers name (``kind`` is
    ``results`` or ``failed``), or the plan names (``rejects``). Never a listing: a
    listing may show an attempt that lost, or one that died before its marker."""
    output = JobOutput(location)
    if kind == "rejects":
        manifest = output.plans.manifest() or {}
        return [output.store.uri(k) for k in manifest.get("rejects_files", [REJECTS])]
    wanted = {"results": "ok", "failed": "failed"}[kind]
    markers = output.shards.committed()
    return [
        output.store.uri(f["key"])
        for shard in sorted(markers)
        for f in markers[shard]["files"]
        if f["kind"] == wanted
    ]


def new_run_location(location: str) -> str:
    """The first ``LOCATION-runN`` beside ``location`` that holds no run."""
    for n in range(2, 1000):
        candidate = f"{location.rstrip('/')}-run{n}"
        if not JobOutput(candidate).holds_a_run():
            return candidate
    raise OutputExistsError(f"output.path: no free -runN location beside {location}")
