"""``nightshift jobs status`` and ``jobs export``: what an output holds, from its markers.

Both read commit markers, checkpoints and the plan only; a listing of data files is
never taken as the truth (it may show a losing attempt or a dead one's leftovers).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from nightshift.errors import UserError
from nightshift.io.objectstore import open_store
from nightshift.io.outputs import JobOutput
from nightshift.io.parquetfiles import write_parts
from nightshift.io.planstore import PLAN_DIR


def output_status(location: str) -> dict[str, Any]:
    output = JobOutput(location)
    manifest = output.plans.manifest()
    if manifest is None:
        if output.store.list(f"{PLAN_DIR}/"):  # a plan cut short: its run stopped writing it
            raise UserError(
                f"{location} holds a plan its run did not finish writing; rerun "
                "`nightshift jobs run SPEC` to finish it (and the job)"
            )
        raise UserError(f"{location} holds no nightshift plan (nothing was run there yet)")
    markers = output.shards.committed()
    shards = []
    for planned in manifest["shards"]["each"]:
        shards.append(_shard_state(output, planned, markers.get(planned["index"])))
    failed_now = (output.report() or {}).get("shards", {}).get("failed", {})
    for shard in shards:
        if shard["state"] != "done" and str(shard["index"]) in failed_now:
            shard["state"], shard["error"] = "failed", failed_now[str(shard["index"])]
    states = [s["state"] for s in shards]
    return {
        "output": location,
        "job": manifest["job"],
        "shards": {k: states.count(k) for k in ("done", "partial", "failed", "pending")},
        "records": {
            "input": manifest["records"]["input"],
            "ok": sum(s["ok"] for s in shards),
            "rejected": manifest["records"]["rejected"],
            "failed": sum(s["failed"] for s in shards),
            "not_yet_run": sum(s["planned"] - s["ok"] - s["failed"] for s in shards),
        },
        "each": shards,
    }


def _shard_state(output: JobOutput, planned: dict, marker: dict | None) -> dict[str, Any]:
    index = planned["index"]
    if marker:
        records = marker["records"]
        return {
            "index": index,
            "state": "done",
            "planned": records["planned"],
            "ok": records["ok"],
            "failed": records["failed"],
        }
    files = output.shards.checkpoint(index)
    ok = sum(f.rows for f in files if f.kind == "ok")
    failed = sum(f.rows for f in files if f.kind == "failed")
    state = "partial" if files else "pending"
    return {
        "index": index,
        "state": state,
        "planned": planned["records"],
        "ok": ok,
        "failed": failed,
    }


def status_text(status: dict[str, Any]) -> str:
    s, r = status["shards"], status["records"]
    lines = [
        f"{status['job']} at {status['output']}",
        f"shards: {s['done']} done, {s['partial']} partly done, {s['failed']} failed, "
        f"{s['pending']} not started",
        f"records: {r['ok']:,} ok, {r['rejected']:,} rejected, {r['failed']:,} failed, "
        f"{r['not_yet_run']:,} not yet run, of {r['input']:,}",
    ]
    for shard in status["each"]:
        if shard["state"] != "done":
            extra = f" ({shard['error']})" if shard.get("error") else ""
            lines.append(
                f"  shard {shard['index']}: {shard['state']}, "
                f"{shard['ok'] + shard['failed']:,} of {shard['planned']:,} answered{extra}"
            )
    return "\n".join(lines)


def export_results(location: str, destination: str) -> tuple[str, int]:
    """Write the committed results as one Parquet file at ``destination`` (local or S3)."""
    output = JobOutput(location)
    markers = output.shards.committed()
    keys = [f["key"] for m in sorted(markers) for f in markers[m]["files"] if f["kind"] == "ok"]
    if not keys:
        raise UserError(f"{location} has no committed results to export")
    with tempfile.TemporaryDirectory(prefix="nightshift-export-") as tmp:
        merged = Path(tmp) / "merged.parquet"
        parts = (
            pq.read_table(output.store.download(key, Path(tmp) / f"{n}.parquet"))
            for n, key in enumerate(keys)
        )
        rows = write_parts(parts, merged)
        parent, _, name = destination.rstrip("/").rpartition("/")
        target = open_store(parent or ".")
        target.put_file(name, merged)
    return target.uri(name), rows
