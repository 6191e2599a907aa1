"""The output directory: result parts, rejects, failures and the report.

Layout (every file readable by polars, pyarrow and DuckDB)::

    OUTPUT/results/part-00000.parquet   one row per record answered, in chunks
    OUTPUT/rejects.parquet              records that could not run, with ``reason``
    OUTPUT/failed.parquet               records the engine or parser failed, with ``error``
    OUTPUT/report.json                  counts, tokens, times, throughput, cost

Each file is written under a temporary name and renamed into place, so a reader never
sees half a file.
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
_OWNED = (RESULTS_DIR, REJECTS_FILE, FAILED_FILE, REPORT_FILE)


class OutputDir:
    """A local output directory that nightshift owns the files of."""

    def __init__(self, path: str) -> None:
        if path.startswith("s3://"):
            raise SpecError(
                "output.path", "S3 output is not supported yet", "use a local directory"
            )
        self.root = Path(path)

    def _existing(self) -> list[str]:
        return [name for name in _OWNED if (self.root / name).exists()]

    def check_free(self, overwrite: bool) -> None:
        """Refuse to mix with an earlier run unless told to replace it."""
        existing = self._existing()
        if existing and not overwrite:
            raise OutputExistsError(
                f"output.path: {self.root} already holds a run ({', '.join(existing)}); "
                "pass --overwrite to replace it or choose another output.path"
            )

    def prepare(self, overwrite: bool) -> None:
        """Create the directory, removing an earlier run's files if ``overwrite``."""
        self.check_free(overwrite)
        for name in self._existing():
            target = self.root / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        (self.root / RESULTS_DIR).mkdir(parents=True, exist_ok=True)

    def write_part(self, index: int, table: pa.Table) -> Path:
        return self._write_table(Path(RESULTS_DIR) / f"part-{index:05d}.parquet", table)

    def write_rejects(self, table: pa.Table) -> Path:
        return self._write_table(Path(REJECTS_FILE), table)

    def write_failed(self, table: pa.Table) -> Path:
        return self._write_table(Path(FAILED_FILE), table)

    def write_report(self, report: dict[str, Any]) -> Path:
        target = self.root / REPORT_FILE
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
        os.replace(tmp, target)
        return target

    @property
    def results_glob(self) -> str:
        return str(self.root / RESULTS_DIR / "*.parquet")

    def _write_table(self, relative: Path, table: pa.Table) -> Path:
        target = self.root / relative
        tmp = target.with_name(f".{target.name}.tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, target)
        return target
