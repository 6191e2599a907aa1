"""The I/O of an eval: committed rows, held-out labels, and the eval.json it writes.

Rows are read as ``jobs export`` and ``jobs status`` read them: the files the commit
markers name (results, failed) and the rejects files the plan names, never a listing,
so a resumed or incremental run is scored over its whole output.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from nightshift.errors import InputError, UserError
from nightshift.io.inputs import open_input
from nightshift.io.outputs import EVAL_FILE, JobOutput
from nightshift.io.planstore import REJECTS

# Where each task kind's answer is in an ok row.
ANSWER_COLUMN = {"classify": "label", "extract": "json", "generate": "text", "embed": "embedding"}


@dataclass(frozen=True)
class Target:
    """What an output's answers are: the task kind, its labels, the id column."""

    kind: str
    labels: list[str]
    id_column: str


@dataclass(frozen=True)
class Frames:
    """``evaluation.score``'s three frames, and whether they hold their true values."""

    ok: pl.DataFrame
    failed: pl.DataFrame
    rejected: pl.DataFrame
    has_truth: bool


def output_target(output: JobOutput) -> Target:
    """The task and id column an output was planned with (its plan.json)."""
    manifest = output.plans.manifest()
    if manifest is None:
        raise UserError(f"{output.location} holds no nightshift plan (nothing was run there yet)")
    inputs = manifest.get("fingerprint_inputs") or {}
    task = inputs.get("task") or {}
    if "kind" not in task or "input.id_column" not in inputs:
        raise UserError(f"{output.location}: its plan.json does not say which task it ran")
    return Target(task["kind"], list(task.get("labels") or []), inputs["input.id_column"])


def committed_frames(output: JobOutput, target: Target, truth: str | None) -> Frames:
    """The committed ok and failed rows and the rejects, with ``truth`` (a kept column)
    where every file holds it."""
    markers = output.shards.committed()
    files = {"ok": [], "failed": []}
    for shard in sorted(markers):
        for f in markers[shard]["files"]:
            if f["kind"] in files:
                files[f["kind"]].append(f["key"])
    manifest = output.plans.manifest() or {}
    rejects = [k for k in manifest.get("rejects_files", [REJECTS]) if output.store.exists(k)]
    answer = {"answer": ANSWER_COLUMN[target.kind]}
    with tempfile.TemporaryDirectory(prefix="nightshift-eval-") as tmp:
        parts = {
            "ok": [_read(output, k, tmp, target.id_column, truth, answer) for k in files["ok"]],
            "failed": [
                _read(output, k, tmp, target.id_column, truth, {"text": "text"})
                for k in files["failed"]
            ],
            "rejected": [_read(output, k, tmp, target.id_column, truth, {}) for k in rejects],
        }
    has = truth is not None and all("truth" in p.columns for ps in parts.values() for p in ps)
    names = {"ok": ["answer"], "failed": ["text"], "rejected": []}
    frames = {k: _concat(v, names[k], has) for k, v in parts.items()}
    return Frames(frames["ok"], frames["failed"], frames["rejected"], has)


def _read(
    output: JobOutput, key: str, tmp: str, id_column: str, truth: str | None, more: dict
) -> pl.DataFrame:
    """One committed file's id, ``truth`` (when it holds that column) and ``more``
    (new name -> column), renamed so."""
    path = output.store.download(key, Path(tmp) / "part.parquet")
    names = pq.read_schema(path).names
    wanted = {"id": id_column, **more}
    if truth is not None and truth in names:
        wanted["truth"] = truth
    table = pq.read_table(path, columns=list(dict.fromkeys(wanted.values())))
    frame = pl.from_arrow(table)
    return frame.select([pl.col(col).alias(new) for new, col in wanted.items()])


def _concat(parts: list[pl.DataFrame], names: list[str], truth: bool) -> pl.DataFrame:
    columns = ["id", *(["truth"] if truth else []), *names]
    parts = [p.select(columns) for p in parts if p.height]
    if not parts:
        return pl.DataFrame({c: [] for c in columns})
    return pl.concat(parts, how="vertical_relaxed")


def read_labels(
    path: str, id_column: str, column: str, exclude: str | None = None, what: str = "--labels"
) -> pl.DataFrame:
    """``id`` and ``truth`` from a Parquet file, glob, directory or S3 prefix; an id
    given twice is refused (which label would count?)."""
    dataset = open_input(path, exclude=exclude)
    for name, flag in ((id_column, "--id-column"), (column, "the label column")):
        if name not in dataset.schema.names:
            raise InputError(
                f"{what}: column {name!r} ({flag}) is not in {path}; it has "
                f"{', '.join(dataset.schema.names)}"
            )
    table = dataset.to_table(columns=list(dict.fromkeys([id_column, column])))
    frame = pl.from_arrow(table).select(
        pl.col(id_column).alias("id"), pl.col(column).alias("truth")
    )
    repeated = frame.filter(pl.col("id").is_duplicated())["id"].unique()
    if repeated.len():
        shown = ", ".join(map(str, repeated.head(5).to_list()))
        raise InputError(f"{what}: {path} gives ids more than once ({shown}); keep one each")
    return frame


def join_labels(frames: Frames, labels: pl.DataFrame) -> tuple[Frames, int]:
    """The frames with ``truth`` from ``labels`` (joined on the id), and how many labels
    name an id the output does not hold."""
    joined, seen = {}, set()
    for name in ("ok", "failed", "rejected"):
        frame = getattr(frames, name)
        frame = frame.drop("truth") if "truth" in frame.columns else frame
        left, right = _same_id_type(frame, labels)
        joined[name] = left.join(right, on="id", how="left")
        seen.update(map(str, frame["id"].to_list()))
    missing = sum(str(i) not in seen for i in labels["id"].to_list())
    return Frames(joined["ok"], joined["failed"], joined["rejected"], True), missing


def _same_id_type(left: pl.DataFrame, right: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Ids of two types (integers in one file, text in the other) are compared as text."""
    a, b = left.schema["id"], right.schema["id"]
    if a == b or a == pl.Null:
        return left.with_columns(pl.col("id").cast(b)), right
    return (
        left.with_columns(pl.col("id").cast(pl.String)),
        right.with_columns(pl.col("id").cast(pl.String)),
    )


def write_eval(output: JobOutput, figures: dict[str, Any]) -> str:
    """eval.json beside report.json; its URI."""
    output.store.put_bytes(EVAL_FILE, (json.dumps(figures, indent=2) + "\n").encode())
    return output.store.uri(EVAL_FILE)
