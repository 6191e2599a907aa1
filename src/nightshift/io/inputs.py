"""Find and stream the input Parquet files a spec names.

Input is read in record batches with only the columns the job uses, so memory stays
bounded by the batch size, not the dataset.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from nightshift.errors import InputError, SpecError

_GLOB_CHARS = set("*?[")


def filesystem_for(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding ``path`` and the path inside it (``s3://`` or local)."""
    if path.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        kwargs = {}
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            kwargs = {"endpoint_override": host or scheme, "scheme": scheme if host else "https"}
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        return pafs.S3FileSystem(**kwargs), path.removeprefix("s3://")
    return pafs.LocalFileSystem(), str(Path(path).absolute())


def input_files(path: str) -> tuple[pafs.FileSystem, list[str]]:
    """Every Parquet file ``input.path`` names, sorted so the order is reproducible."""
    fs, inner = filesystem_for(path)
    if any(c in inner for c in _GLOB_CHARS):
        files = _glob(fs, inner)
    else:
        info = fs.get_file_info(inner)
        if info.type == pafs.FileType.File:
            files = [inner]
        elif info.type == pafs.FileType.Directory:
            found = fs.get_file_info(pafs.FileSelector(inner, recursive=True))
            files = [f.path for f in found if f.is_file and f.path.endswith(".parquet")]
        else:
            raise SpecError("input.path", f"{path} does not exist", "check the path")
    if not files:
        raise SpecError("input.path", f"{path} matches no Parquet files", "check the path or glob")
    return fs, sorted(files)


def _glob(fs: pafs.FileSystem, pattern: str) -> list[str]:
    if isinstance(fs, pafs.LocalFileSystem):
        return [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
    # Object stores have no glob: list below the fixed part and match the rest.
    import fnmatch

    base = pattern[: min(pattern.index(c) for c in _GLOB_CHARS if c in pattern)]
    base = base.rsplit("/", 1)[0]
    found = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return [f.path for f in found if f.is_file and fnmatch.fnmatch(f.path, pattern)]


def open_input(path: str) -> ds.Dataset:
    fs, files = input_files(path)
    try:
        return ds.dataset(files, format="parquet", filesystem=fs)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"input.path: cannot read {path} as Parquet: {exc}") from None


def check_columns(dataset: ds.Dataset, needed: dict[str, str]) -> None:
    """``needed`` maps column -> the spec key that asked for it, for the error message."""
    present = set(dataset.schema.names)
    missing = [(col, key) for col, key in needed.items() if col not in present]
    if missing:
        col, key = missing[0]
        raise SpecError(
            key,
            f"column {col!r} is not in the input",
            f"the input has: {', '.join(sorted(present))}",
        )


def read_batches(
    dataset: ds.Dataset, columns: list[str], batch_rows: int
) -> Iterator[pa.RecordBatch]:
    yield from dataset.to_batches(columns=columns, batch_size=batch_rows)
