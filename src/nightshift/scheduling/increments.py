"""Incremental runs: a rerun into the same output plans only the records that are new.

A nightly job points at an input that grows. Each run first takes up the plan already in
the output (finishing its shards), then reads the input's id column; records whose id no
earlier plan holds (as runnable or rejected) are planned as an increment, with shards
numbered after the existing ones. So a night adds only its new records, every id
appears in the output once, and shards already planned never change (DESIGN invariant 4).

Each increment finds the exact repeats among its own records as the first plan does
(``scheduling.dedup``), and plan.json's ``repeats`` adds up every increment's. A new
record that repeats an earlier night's prompt is not a copy: its original sits in a
committed shard, which never changes (copies commit in their original's shard); the
response cache (``cache.path``) is what answers it without generating.

plan.json records the input's file listing (``input_listing``) at each plan and
increment, so a run can tell without reading the input whether it may hold new records
(``input_may_have_grown``): a rerun over the same files reads no id at all, and the
engine's head start (``running.runner.work_may_be_left``) goes by it too.

Set ``run.incremental: false`` to make a rerun only resume. To generate everything
again, run with ``--overwrite`` (replace) or ``--new-run`` (a fresh output beside it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
from datetime import datetime, timezone
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import InputError, NightshiftError
from nightshift.io.inputs import READ_BATCH, file_batches, input_files
from nightshift.io.planstore import MANIFEST, REJECTS, PlanStore, increment_files, input_schema
from nightshift.jobs.spec import JobSpec
from nightshift.scheduling.known import KnownIds
from nightshift.scheduling.plan import build_plan, describe, open_job_input

log = logging.getLogger(__name__)


def add_new_records(
    spec: JobSpec,
    plans: PlanStore,
    manifest: dict[str, Any],
    encoder: PromptEncoder,
    progress: bool,
) -> dict[str, Any]:
    """Plan the input's records that no plan in this output holds yet; return the
    manifest with them added (or unchanged but for the input listing, when there are
    none)."""
    listing = input_listing(spec)  # before reading: a file added meanwhile shows next time
    known = KnownIds(planned_ids(plans, manifest, spec.input.id_column))  # built once
    if not _has_new_ids(spec, known):
        if listing != manifest.get("input_listing"):  # touched, not grown: say so once
            manifest = {**manifest, "input_listing": listing}
            plans.store.put_bytes(MANIFEST, json.dumps(manifest, indent=2).encode())
        return manifest
    first_shard = 1 + max((s["index"] for s in manifest["shards"]["each"]), default=-1)
    if spec.eval is not None and spec.eval.column not in input_schema(manifest).names:
        # eval added since the first plan: plan without its column (the report joins
        # the labels from the input), so every shard of the output has the same columns
        spec = spec.model_copy(update={"eval": None})
    plan = build_plan(spec, encoder, progress, skip_ids=known, first_shard=first_shard)
    if plan.input_schema != input_schema(manifest):
        raise InputError(
            f"input.path: the input's columns changed since this output's first run "
            f"(now {plan.input_schema}); pass --new-run to start a fresh output"
        )
    increment = len(increments(manifest))
    summary = describe(plan, spec)
    merged = {**merge_manifests(manifest, summary, increment), "input_listing": listing}
    plans.write(plan, merged, increment)
    log.info("planned %d new records as increment %d", plan.records.height, increment)
    return plans.manifest()


def planned_ids(plans: PlanStore, manifest: dict[str, Any], id_column: str) -> pl.Series:
    """Every id an increment of this output planned, runnable or rejected."""
    runnable = plans.read_column(manifest.get("records_files", [_FIRST["records"]]), "record_id")
    rejected = plans.read_column(manifest.get("rejects_files", [REJECTS]), id_column)
    return pl.concat([pl.from_arrow(runnable), pl.from_arrow(rejected)]).drop_nulls().unique()


def _has_new_ids(spec: JobSpec, known: KnownIds) -> bool:
    """Whether the input holds an id not in ``known``: a pass over the id column only, so
    a night with nothing new costs one cheap read. Records without an id cannot be told
    apart from night to night; the first plan rejected them, later ones skip them."""
    dataset, columns = open_job_input(spec)
    for index in range(len(dataset.files)):
        for batch in file_batches(dataset, index, [columns[0]], READ_BATCH):
            ids = pl.from_arrow(pa.Table.from_batches([batch]))[columns[0]].drop_nulls()
            if not known.contains(ids).all():
                return True
    return False


def input_listing(spec: JobSpec) -> str | None:
    """A digest of the input's file listing (paths, sizes, modification times): one
    listing, no file read. None when the input cannot be listed (planning says why)."""
    try:
        fs, files = input_files(spec.input.path, exclude=spec.output.path)
        infos = _file_infos(fs, files)
    except (NightshiftError, OSError):
        return None
    h = hashlib.sha256()
    for info in sorted(infos, key=lambda i: i.path):
        h.update(f"{info.path}\0{info.size}\0{info.mtime_ns}\n".encode())
    return h.hexdigest()


def _file_infos(fs: pafs.FileSystem, files: list[str]) -> list[pafs.FileInfo]:
    """Size and modification time of ``files``: one listing of the folder they share
    (on S3 a LIST, where a HEAD per file would cost one request each)."""
    if len(files) > 1:
        wanted = set(files)
        selector = pafs.FileSelector(posixpath.commonpath(files), recursive=True)
        found = [info for info in fs.get_file_info(selector) if info.path in wanted]
        if len(found) == len(wanted):
            return found
    return fs.get_file_info(files)  # one file, or the listing named them otherwise


def input_may_have_grown(spec: JobSpec, manifest: dict[str, Any]) -> bool:
    """Whether the input's listing differs from the one plan.json recorded (or it
    recorded none): the input may hold records no increment planned yet."""
    recorded = manifest.get("input_listing")
    return recorded is None or input_listing(spec) != recorded


def increments(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The increments a manifest adds up; a plan from before increments is the first."""
    first = {
        "index": 0,
        "records": manifest["records"]["runnable"],
        "rejected": manifest["records"]["rejected"],
        "shards": [s["index"] for s in manifest["shards"]["each"]],
        "repeats": manifest.get("repeats", _NO_REPEATS),
    }
    return manifest.get("increments") or [first]


_FIRST = increment_files(0)
_NO_REPEATS = {"copies": 0, "prompt_tokens_not_sent": 0}
_SUMMED = {"records": ("input", "runnable", "rejected", "over_length")}


def merge_manifests(old: dict[str, Any], new: dict[str, Any], increment: int) -> dict[str, Any]:
    """``old``'s plan.json with increment ``new`` (a ``describe`` summary) added."""
    files = increment_files(increment)
    each = old["shards"]["each"] + new["shards"]["each"]
    merged = {
        **old,
        "records": {k: old["records"][k] + new["records"][k] for k in _SUMMED["records"]},
        "rejects_by_kind": _add_counts(old["rejects_by_kind"], new["rejects_by_kind"]),
        "tokens": _merge_tokens(old["tokens"], new["tokens"]),
        "shards": {
            "count": len(each),
            "records_max": max(old["shards"]["records_max"], new["shards"]["records_max"]),
            "prompt_tokens_max": max(
                old["shards"]["prompt_tokens_max"], new["shards"]["prompt_tokens_max"]
            ),
            "each": each,
        },
        "prefix_reuse": _merge_reuse(old, new),
        "records_files": old.get("records_files", [_FIRST["records"]]) + [files["records"]],
        "rejects_files": old.get("rejects_files", [REJECTS]) + [files["rejects"]],
        "repeats": _add_counts(old.get("repeats", {}), new.get("repeats", {})),
        "increments": increments(old) + [_increment_entry(new, increment)],
    }
    merged.pop("input_schema")  # written again by PlanStore.write
    return merged


def _increment_entry(new: dict[str, Any], increment: int) -> dict[str, Any]:
    return {
        "index": increment,
        "planned_at": datetime.now(timezone.utc).isoformat(),
        "records": new["records"]["runnable"],
        "rejected": new["records"]["rejected"],
        "shards": [s["index"] for s in new["shards"]["each"]],
        "repeats": new.get("repeats", _NO_REPEATS),
    }


def _add_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def _merge_tokens(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    summed = ("prompt", "output_at_most", "counted_exactly_records")
    return {
        **old,
        **{k: old[k] + new[k] for k in summed},
        "prompt_max": max(old["prompt_max"], new["prompt_max"]),
    }


def _merge_reuse(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Predicted reuse over all increments, weighted by their prompt tokens."""
    a, b = old["tokens"]["prompt"], new["tokens"]["prompt"]
    reuse = dict(new["prefix_reuse"])
    for key in ("predicted", "input_order"):
        mixed = old["prefix_reuse"][key] * a + new["prefix_reuse"][key] * b
        reuse[key] = mixed / (a + b) if a + b else 0.0
    return reuse
