"""Durable shards: checkpoints while a shard runs, one marker when it commits.

Layout under the output (local directory or S3 prefix)::

    committed/shard-00000.json           the commit marker: the shard's exact files, row
                                         counts and checksums, and its counts and tokens
    results/shard-00000-<attempt>.parquet  a committed shard's answers
    failed/shard-00000-<attempt>.parquet   a committed shard's failed records
    _work/shard-00000/progress-<attempt>.json  checkpoints of a shard still running: the
                                         chunks that attempt wrote
    _work/shard-00000/<attempt>-00003.ok.arrow / .failed.arrow   one chunk (Arrow IPC:
                                         only nightshift reads it; an earlier run's
                                         ``.parquet`` chunks are read the same)

The protocol, for a crash at any instant:

* A chunk is written under a key no other attempt uses, then the attempt's own progress
  file is rewritten to name it. A crash between the two loses that one chunk, never
  more. Each attempt writes only its own progress file, so two attempts on one shard
  (two runs on one output, a worker whose lease expired mid-write) never overwrite or
  append to each other's; a shard's checkpoint is all its progress files together, and
  records both attempts answered are kept once when the shard commits
  (``one_row_per_record``).
* A shard commits by writing its merged data under attempt-unique keys, then creating
  its marker with a conditional put (create only if absent): of two attempts racing, one
  marker wins and the loser deletes its files. Object stores have no rename; the marker
  decides which attempt's files count.
* Readers, ``status`` and resume trust markers and progress files only, never a listing
  of data. Listings are used for two things: finding a shard's progress files, and
  deleting files a marker has made dead (losers, and the leftovers of attempts that
  died between data and marker once their shard commits).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

from nightshift.errors import NightshiftError, ObjectNotFound, StoreAccessError, StoreError
from nightshift.faults import crash_point
from nightshift.io.objectstore import ObjectStore
from nightshift.io.parquetfiles import (
    CHUNK_SUFFIX,
    chunk_bytes,
    parquet_bytes,
    read_table,
    write_parquet,
    write_parts,
)

log = logging.getLogger(__name__)

COMMITTED, RESULTS, FAILED, WORK = "committed", "results", "failed", "_work"
# The only names nightshift writes in results/ and failed/; nothing else there is touched.
DATA_FILE = re.compile(r"^(results|failed)/shard-(?P<shard>\d{5})-(?P<attempt>[0-9a-f]+)\.parquet$")
MARKER_FILE = re.compile(rf"^{COMMITTED}/shard-\d{{5}}\.json$")
# An attempt's progress file in _work/shard-N/ (progress.json: one from before attempts
# had their own, still read on resume).
PROGRESS_FILE = re.compile(r"^progress(-[0-9a-f]+)?\.json$")
# Tables up to this size (in memory) are put from memory; larger ones go through a
# file (S3 uploads those in parts)
PUT_IN_ONE = 64 * 1024 * 1024


@dataclass(frozen=True)
class StoredFile:
    key: str
    rows: int
    sha256: str
    kind: str  # "ok" or "failed"


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}"


class ShardStore:
    """Checkpoints and commits of one output's shards."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def marker_key(self, shard: int) -> str:
        return f"{COMMITTED}/{shard_name(shard)}.json"

    def progress_key(self, shard: int, attempt: str) -> str:
        return f"{WORK}/{shard_name(shard)}/progress-{attempt}.json"

    def committed(self) -> dict[int, dict[str, Any]]:
        """Every commit marker, by shard."""
        markers = {}
        for key in self.store.list(f"{COMMITTED}/"):
            if MARKER_FILE.match(key):  # a user's committed/notes.json is no marker
                marker = json.loads(self.store.get_bytes(key))
                markers[marker["shard"]] = marker
        return markers

    def checkpoint(self, shard: int) -> list[StoredFile]:
        """The chunks a shard has checkpointed so far, by all its attempts together (none
        if it never checkpointed)."""
        files: dict[str, StoredFile] = {}
        for key in sorted(self.store.list(f"{WORK}/{shard_name(shard)}/")):
            if PROGRESS_FILE.match(key.rsplit("/", 1)[-1]):
                for f in self._progress(key):
                    files.setdefault(f.key, f)
        return list(files.values())

    def write_chunk(
        self, shard: int, attempt: str, index: int, tables: dict[str, pa.Table]
    ) -> list[StoredFile]:
        """Write one chunk (its ok and failed rows), then name it in the attempt's
        progress file; returns the chunk's files."""
        key = self.progress_key(shard, attempt)
        mine = self._progress(key)
        prefix = f"{WORK}/{shard_name(shard)}/{attempt}-{index:05d}"
        added = [
            self._put_chunk(f"{prefix}.{kind}{CHUNK_SUFFIX}", table, kind)
            for kind, table in tables.items()
            if table.num_rows
        ]
        crash_point("chunk.written")
        files = mine + added
        payload = {
            "shard": shard,
            "attempt": attempt,
            "files": [asdict(f) for f in files],
            "updated": time.time(),
        }
        self.store.put_bytes(key, json.dumps(payload).encode())
        return added

    def _progress(self, key: str) -> list[StoredFile]:
        """The chunks one progress file names (none once it is gone: the shard committed)."""
        try:
            progress = json.loads(self.store.get_bytes(key))
        except ObjectNotFound:
            return []
        return [StoredFile(**f) for f in progress["files"]]

    def read(self, files: list[StoredFile], kind: str) -> list[pa.Table]:
        return [self._get_table(f.key) for f in files if f.kind == kind]

    def commit(
        self,
        shard: int,
        attempt: str,
        tables: dict[str, pa.Table | TableParts],
        summary: dict[str, Any],
    ) -> bool:
        """Write the shard's data, then its marker. False if another attempt committed it
        first (this attempt's files are then deleted)."""
        folders = {"ok": RESULTS, "failed": FAILED}
        files = []
        for kind, table in tables.items():
            key = f"{folders[kind]}/{shard_name(shard)}-{attempt}.parquet"
            put = self._put_parts if isinstance(table, TableParts) else self._put_table
            files.append(put(key, table, kind))
        crash_point("shard.data_written")
        marker = {"shard": shard, "attempt": attempt, "files": [asdict(f) for f in files]}
        marker.update(summary, committed_at=time.time())
        if not self.store.put_if_absent(self.marker_key(shard), json.dumps(marker).encode()):
            winner = self.marker(shard) or {"files": []}
            named = {f["key"] for f in winner["files"]}  # never a file the marker names
            self.store.delete([f.key for f in files if f.key not in named])
            self.forget_work(shard)  # the winner's marker names the shard's data now
            return False
        self.forget_work(shard)
        return True

    def forget_work(self, shard: int) -> None:
        """Delete a committed shard's checkpoints (the marker names its data now). Best
        effort: the shard is committed whatever happens here, and what is left is only
        ever read for a shard without a marker. A store that refuses us (no permission
        to delete) still stops the run: the user's to fix."""
        try:
            self.store.delete(self.store.list(f"{WORK}/{shard_name(shard)}/"))
        except StoreAccessError:
            raise
        except StoreError as exc:
            log.warning("shard %d is committed; its checkpoints stay: %s", shard, exc)

    def marker(self, shard: int) -> dict[str, Any] | None:
        """The shard's commit marker, or None while it is uncommitted (one read)."""
        try:
            return json.loads(self.store.get_bytes(self.marker_key(shard)))
        except ObjectNotFound:
            return None

    def delete_unnamed(self, attempt: str | None = None) -> int:
        """Delete result and failure files that are provably dead; returns how many.

        A file is dead when its shard's marker exists and names other files: markers are
        created once and never replaced, so that file's attempt lost (or will lose its
        race). A file of a shard without a marker may belong to an attempt elsewhere that
        is between its data and its marker: it is kept, unless it is ``attempt``'s own
        (this run, which has finished its shards). Markers are read after the listing, so
        a marker created meanwhile protects its files."""
        listed = [DATA_FILE.match(key) for key in self.data_files()]
        markers = {s: self.marker(s) for s in {int(m["shard"]) for m in listed}}
        named = {f["key"] for m in markers.values() if m for f in m["files"]}
        stale = []
        for m in listed:
            if markers[int(m["shard"])] is None:
                dead = m["attempt"] == attempt  # this run will commit nothing more
            else:
                dead = m.string not in named
            if dead:
                stale.append(m.string)
        self.store.delete(stale)
        return len(stale)

    def data_files(self) -> list[str]:
        """Every result or failure file nightshift may have written here (a listing: for
        clean-up only, never for reading)."""
        keys = self.store.list(f"{RESULTS}/") + self.store.list(f"{FAILED}/")
        return [key for key in keys if DATA_FILE.match(key)]

    def _put_parts(self, key: str, table: TableParts, kind: str) -> StoredFile:
        digest = hashlib.sha256()

        def write(out: BinaryIO) -> None:  # called once (``ObjectStore.put_written``)
            written = write_parts(table.parts(), _Digesting(out, digest))
            if written != table.rows:  # raised before the file is put: nothing is named
                raise NightshiftError(
                    f"{key}: the parts read again held {written} rows, not the {table.rows} counted"
                )

        self.store.put_written(key, write)
        return StoredFile(key, table.rows, digest.hexdigest(), kind)

    def _put_table(self, key: str, table: pa.Table, kind: str) -> StoredFile:
        if table.nbytes <= PUT_IN_ONE:  # from memory, no temp file
            return self._put_bytes(key, parquet_bytes(table), table.num_rows, kind)
        digest = hashlib.sha256()  # a large shard: written as a file (parts on S3)

        def write(out: BinaryIO) -> None:
            write_parquet(table, _Digesting(out, digest))

        self.store.put_written(key, write)
        return StoredFile(key, table.num_rows, digest.hexdigest(), kind)

    def _put_chunk(self, key: str, table: pa.Table, kind: str) -> StoredFile:
        return self._put_bytes(key, chunk_bytes(table), table.num_rows, kind)

    def _put_bytes(self, key: str, data: pa.Buffer, rows: int, kind: str) -> StoredFile:
        # a view, not a copy (1.3 µs a 576-float row); bytes, as ``bytes`` compares them
        payload = memoryview(data).cast("B")
        self.store.put_bytes(key, payload)
        return StoredFile(key, rows, hashlib.sha256(payload).hexdigest(), kind)

    def _get_table(self, key: str) -> pa.Table:
        return read_table(self.store.get_bytes(key), key)


class _Digesting:
    """A stream for Parquet's writer that hashes what it writes through to ``out``."""

    closed = False

    def __init__(self, out: BinaryIO, digest: Any) -> None:
        self.out, self.digest, self.written = out, digest, 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.written += len(data)
        return self.out.write(data)

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        self.out.flush()


@dataclass(frozen=True)
class TableParts:
    """A table ``ShardStore.commit`` writes part by part, never holding it whole: ``parts``
    gives its parts in order (each time it is called), ``rows`` in all."""

    rows: int
    parts: Callable[[], Iterator[pa.Table]]


def one_row_per_record(ok: pa.Table, failed: pa.Table, id_column: str) -> tuple[pa.Table, pa.Table]:
    """``ok`` and ``failed`` with one row per record id: attempts that overlapped may each
    have checkpointed a record. An ok answer wins over a failure; else the first row."""
    ok = _first_per_id(ok, id_column)
    failed = _first_per_id(failed, id_column)
    answered = pc.is_in(failed.column(id_column), value_set=ok.column(id_column).combine_chunks())
    return ok, failed.filter(pc.invert(pc.fill_null(answered, False)))


def _first_per_id(table: pa.Table, id_column: str) -> pa.Table:
    if table.num_rows == 0:
        return table
    rows = pa.table({"id": table.column(id_column), "row": pa.array(range(table.num_rows))})
    first = rows.group_by("id", use_threads=False).aggregate([("row", "min")])
    keep = first.column("row_min").to_pylist()
    if len(keep) == table.num_rows:
        return table
    return table.take(sorted(keep))
