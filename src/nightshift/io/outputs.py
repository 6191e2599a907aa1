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
    OUTPUT/eval.json              ``jobs eval``'s figures against held-out labels
    OUTPUT/canary/                the canary's sample runs (``pipelines.canary``)

Only keys of the exact names nightshift writes (``RUN_KEY``, ``shardstore.DATA_FILE``,
the rejects files the plan names, report.*) are nightshift's: anything else in the
output location is never read, replaced or deleted, and a location that holds other
files but nothing of nightshift's is refused (``refuse_foreign``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nightshift.errors import ObjectNotFound, OutputExistsError, SpecError
from nightshift.io.leases import LEASES
from nightshift.io.objectstore import ObjectStore, open_store
from nightshift.io.planstore import CANARY_DIR, MANIFEST, PLAN_DIR, REJECTS, PlanStore
from nightshift.io.shardstore import COMMITTED, DATA_FILE, MARKER_FILE, WORK, ShardStore

REPORT_FILE = "report.json"
REPORT_PAGE = "report.md"  # the same figures for people, with the chart
REPORT_CHART = "report.png"
EVAL_FILE = "eval.json"  # `jobs eval`: an output scored against held-out labels
SHARD = r"shard-\d{5}"
# The keys nightshift writes in folders of its own: their presence shows a run was here.
# (A user's report.md or rejects.parquet shows nothing; report.json is checked inside.)
RUN_KEY = re.compile(
    rf"""^({PLAN_DIR}/(plan|calibration|canary|built)\.json
    |{PLAN_DIR}/(records(-\d{{4}})?\.parquet|built-rejects\.parquet|shards/{SHARD}\.parquet)
    |{CANARY_DIR}/(reference|job|cache)/.+
    |{COMMITTED}/{SHARD}\.json
    |{WORK}/({SHARD}/.+|workers/[^/]+\.json)
    |{LEASES}/{SHARD}/\d{{5}}\.json)$""",
    re.VERBOSE,
)
REJECTS_FILE = re.compile(r"^rejects(-\d{4})?\.parquet$")
SHOWN_AT_MOST = 5  # foreign keys named in a refusal


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
        """Whether an earlier run (finished, partial, or from an older nightshift) is here:
        a plan, a commit marker, a shard's data or nightshift's report.json."""
        return bool(
            self.plans.manifest() is not None
            or any(MARKER_FILE.match(k) for k in self.store.list(f"{COMMITTED}/"))
            or self.shards.data_files()
            or self._holds_our_report()
        )

    def refuse_foreign(self) -> None:
        """Refuse a location that is not empty yet holds nothing of nightshift's: every
        file in it is someone else's, and a run would replace some (report.md,
        rejects.parquet) or, with --overwrite, be asked to delete them."""
        if self.holds_a_run():  # a resume costs one read of plan.json here
            return
        keys = self.store.list("")
        if not keys or any(RUN_KEY.match(k) for k in keys):  # empty, or a plan cut short
            return
        shown = ", ".join(keys[:SHOWN_AT_MOST]) + (", ..." if len(keys) > SHOWN_AT_MOST else "")
        raise OutputExistsError(
            f"output.path: {self.location} holds files that are not a nightshift run "
            f"({shown}); nightshift writes only into an empty location or its own runs, "
            "and never replaces or deletes other files, not even with --overwrite: "
            "choose an empty (or new) output.path, or move those files elsewhere"
        )

    def clear(self) -> None:
        """Delete the keys nightshift wrote here (for --overwrite), by their names only:
        markers first, so a reader never sees a marker whose files are gone, and
        plan.json last, since it names the increments' rejects files."""
        manifest = self.plans.manifest() or {}
        named = manifest.get("rejects_files", [REJECTS])
        rejects = [k for k in named if isinstance(k, str) and REJECTS_FILE.match(k)]
        keys = self.store.list("")
        markers = [k for k in keys if k.startswith(f"{COMMITTED}/") and RUN_KEY.match(k)]
        owned = [k for k in keys if (RUN_KEY.match(k) or DATA_FILE.match(k)) and k != MANIFEST]
        reports = [REPORT_FILE, REPORT_PAGE, REPORT_CHART, EVAL_FILE]
        self.store.delete(markers)
        self.store.delete([k for k in owned if k not in markers] + rejects + reports)
        self.store.delete([MANIFEST])

    def _holds_our_report(self) -> bool:
        try:
            report = json.loads(self.store.get_bytes(REPORT_FILE))
        except (ObjectNotFound, ValueError):
            return False
        return isinstance(report, dict) and {"job", "records"} <= report.keys()


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
    """The first ``LOCATION-runN`` beside ``location`` that holds nothing."""
    for n in range(2, 1000):
        candidate = f"{location.rstrip('/')}-run{n}"
        if not JobOutput(candidate).store.list(""):  # nothing there, neither ours nor others
            return candidate
    raise OutputExistsError(f"output.path: no free -runN location beside {location}")
