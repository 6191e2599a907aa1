"""A running batch as its clients poll it: live request counts, and its window.

Clients poll a batch for progress, so while its job runs the record's
``request_counts`` follow what is answered: ``completed`` the requests (lines) answered
so far (committed shards and checkpoints, as ``nightshift jobs status`` counts them; a
several-input embeddings line once all its inputs are), ``failed`` the bad lines and
those set aside or failed. They only grow and never add up to more than ``total``; the
end state (``lifecycle.finish``) writes the final figures, which include every answer
checkpointed (``lineorder``), so they never fall either.

A batch that is not finished by its ``expires_at`` (its completion window after it was
created, 24 hours as the providers have it, ``--expire-after`` for the server) expires:
its job stops gracefully, what was answered is kept, and every request not run ends
``batch_expired`` (OpenAI) or ``expired`` (Anthropic), as the providers end them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from nightshift.batch.lifecycle import announce
from nightshift.batch.store import BatchStore
from nightshift.errors import ObjectNotFound, UserError

log = logging.getLogger(__name__)
LOG_EVERY_S = 30.0  # a running batch's counts in the server's log at most this often
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


def expired(record: dict[str, Any], now: float | None = None) -> bool:
    """Whether ``record``'s completion window has passed."""
    return (now or time.time()) >= record["expires_at"]


def answered_so_far(work_uri: str) -> dict[str, int] | None:
    """The batch's requests (lines) completed and failed so far; None before its
    conversion. A line is done when every record it became is answered: one record, or
    one per input of a several-input embeddings line."""
    from nightshift.batch.run import JOB_DIR, MARKER
    from nightshift.io.objectstore import open_store
    from nightshift.jobs.status import output_status

    work = open_store(work_uri)
    try:
        marker = json.loads(work.get_bytes(MARKER))
    except ObjectNotFound:
        return None
    failed = marker["bad_lines"]
    if not marker["records"]:
        return {"completed": 0, "failed": failed}
    if marker["records"] != marker["lines"] - failed:  # a line is several records
        done = _lines_done(work, JOB_DIR)
        return {"completed": done["completed"], "failed": failed + done["failed"]}
    try:
        records = output_status(work.uri(JOB_DIR))["records"]
    except UserError:  # no plan yet
        return {"completed": 0, "failed": failed}
    return {"completed": records["ok"], "failed": failed + records["rejected"] + records["failed"]}


def _lines_done(work: Any, job_dir: str) -> dict[str, int]:
    """Lines whose records are all answered: completed when every one is ok, else failed."""
    import tempfile
    from pathlib import Path

    import numpy as np
    import pyarrow.parquet as pq

    from nightshift.batch.jobspec import RECORDS
    from nightshift.batch.lineorder import FAILED, answer_sources, place
    from nightshift.batch.records import ID_COLUMN

    with tempfile.TemporaryDirectory(prefix="nightshift-counts-") as tmp:
        records = pq.read_table(
            work.download(RECORDS, Path(tmp, "records.parquet")), columns=[ID_COLUMN, "line"]
        )
        kinds = place(answer_sources(work.uri(job_dir), Path(tmp)), records.column(ID_COLUMN))
    _, line = np.unique(records.column("line").to_numpy(), return_inverse=True)
    total = np.bincount(line)
    done = np.bincount(line, weights=kinds > 0, minlength=len(total)) == total
    bad = np.bincount(line, weights=kinds >= FAILED, minlength=len(total)) > 0
    return {"completed": int((done & ~bad).sum()), "failed": int((done & bad).sum())}


class LiveCounts:
    """While its ``with`` block runs, every ``every_s`` the record's request counts are
    brought up to what its job answered (never lowered)."""

    def __init__(self, batches: BatchStore, record: dict, work_uri: str, every_s: float = 2.0):
        self.batches, self.batch_id, self.work_uri = batches, record["id"], work_uri
        self.every_s, self._done = every_s, threading.Event()
        self._said = time.monotonic()  # when the log last had a line of its counts
        self._warned = False
        self._thread = threading.Thread(target=self._loop, name="nightshift-counts", daemon=True)

    def __enter__(self) -> LiveCounts:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._done.wait(self.every_s):
            try:
                self.update()
            except Exception:  # a count is a nicety: never the batch's failure
                level = logging.DEBUG if self._warned else logging.WARNING  # said once
                log.log(level, "batch %s: live counts not read", self.batch_id, exc_info=True)
                self._warned = True

    def update(self) -> None:
        found = answered_so_far(self.work_uri)
        if found is None:
            return

        def change(record: dict[str, Any]) -> dict[str, Any] | None:
            counts = record["request_counts"]
            if record["status"] not in ("in_progress", "cancelling"):
                return None
            grown = {k: max(counts[k], v) for k, v in found.items()}
            if grown.items() <= counts.items() or sum(grown.values()) > counts["total"]:
                return None  # nothing new, or figures no request count may show
            return {**record, "request_counts": {**counts, **grown}}

        grown = self.batches.update_batch(self.batch_id, change)
        if grown is not None and time.monotonic() - self._said >= LOG_EVERY_S:
            self._said = time.monotonic()
            announce(grown, "running")
