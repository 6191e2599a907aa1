"""The output directory: result parts, rejects, failures and the report.

Layout (every file readable by polars, pyarrow and DuckDB)::

    OUTPUT/results/part-00000.parquet   one row per record answered, in chunks
    OUTPUT/rejects.parquet              records that could not run, with ``reason``
    OUTPUT/failed.parquet               records the engine or parser failed, with ``error``
    OUTPUT/report.json                  counts, tokens, times, throughput, cost

A run writes into ``OUTPUT/.nightshift-staging/`` and moves its files into place only
when it has finished, report last: a run that dies leaves the previous run's files as
they were. Only nightshift's own files are ever replaced or deleted.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from nightshift.errors import OutputExistsError, SpecError

RESULTS_DIR = "results"
REJECTS_FILE = "rejects.parquet"
FAILED_FILE = "failed.parquet"
REPORT_FILE = "report.json"
STAGING_DIR = ".nightshift-staging"
_PART_GLOB = "part-*.parquet"


class OutputDir:
    """A local output directory; nightshift owns only the files it names above."""

    def __init__(self, path: str) -> None:
        if path.startswith("s3://"):
            raise SpecError(
                "output.path", "S3 output is not supported yet", "use a local directory"
            )
        self.root = Path(path).expanduser()
        self.staging = self.root / STAGING_DIR

    def _run_files(self) -> list[Path]:
        """The files of a finished run in this directory, if it holds one."""
        files = sorted((self.root / RESULTS_DIR).glob(_PART_GLOB))
        files += [self.root / n for n in (REJECTS_FILE, FAILED_FILE, REPORT_FILE)]
        return [f for f in files if f.is_file()]

    def check_free(self, overwrite: bool) -> None:
        """Make sure the directory can take a run; refuse to mix with an earlier one."""
        if self.root.exists() and not self.root.is_dir():
            raise SpecError("output.path", f"{self.root} is a file", "give a directory")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError("output.path", f"cannot create {self.root}: {exc.strerror}") from None
        if self._run_files() and not overwrite:
            raise OutputExistsError(
                f"output.path: {self.root} already holds a run; "
                "pass --overwrite to replace it or choose another output.path"
            )

    def start(self) -> None:
        """An empty staging area for this run (a dead run's leftovers are discarded)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        (self.staging / RESULTS_DIR).mkdir(parents=True)

    def write_part(self, index: int, table: pa.Table) -> Path:
        return self._write_table(Path(RESULTS_DIR) / f"part-{index:05d}.parquet", table)

    def write_rejects(self, table: pa.Table) -> Path:
        return self._write_table(Path(REJECTS_FILE), table)

    def write_failed(self, table: pa.Table) -> Path:
        return self._write_table(Path(FAILED_FILE), table)

    def commit(self, report: dict[str, Any]) -> Path:
        """Replace the previous run's files with this run's, the report last."""
        for old in self._run_files():
            old.unlink()
        (self.root / RESULTS_DIR).mkdir(exist_ok=True)
        for part in sorted((self.staging / RESULTS_DIR).glob(_PART_GLOB)):
            os.replace(part, self.root / RESULTS_DIR / part.name)
        for name in (REJECTS_FILE, FAILED_FILE):
            os.replace(self.staging / name, self.root / name)
        target = self.root / REPORT_FILE
        tmp = self.staging / REPORT_FILE
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, target)
        shutil.rmtree(self.staging, ignore_errors=True)
        return target

    def _write_table(self, relative: Path, table: pa.Table) -> Path:
        target = self.staging / relative
        tmp = target.with_name(f".{target.name}.tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, target)
        return target
