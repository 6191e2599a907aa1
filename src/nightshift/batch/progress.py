"""A running batch as its clients poll it: live request counts, and its window.

Clients poll a batch for progress, so while its job runs the record's
``request_counts`` follow what is answered: ``completed`` the records answered so far
(committed shards and checkpoints, as ``nightshift jobs status`` counts them),
``failed`` the bad lines and the records set aside or failed. They only grow; the end
state (``lifecycle.finish``) writes the final figures.

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

from nightshift.batch.store import BatchStore
from nightshift.errors import ObjectNotFound, UserError

log = logging.getLogger(__name__)
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


def expired(record: dict[str, Any], now: float | None = None) -> bool:
    """Whether ``record``'s completion window has passed."""
    return (now or time.time()) >= record["expires_at"]


def answered_so_far(work_uri: str) -> dict[str, int] | None:
    """The batch's requests completed and failed so far; None before its conversion."""
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
    try:
        records = output_status(work.uri(JOB_DIR))["records"]
    except UserError:  # no plan yet
        return {"completed": 0, "failed": failed}
    return {"completed": records["ok"], "failed": failed + records["rejected"] + records["failed"]}


class LiveCounts:
    """While its ``with`` block runs, every ``every_s`` the record's request counts are
    brought up to what its job answered (never lowered)."""

    def __init__(self, batches: BatchStore, record: dict, work_uri: str, every_s: float = 2.0):
        self.batches, self.batch_id, self.work_uri = batches, record["id"], work_uri
        self.every_s, self._done = every_s, threading.Event()
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
                log.debug("batch %s: live counts not read", self.batch_id, exc_info=True)

    def update(self) -> None:
        found = answered_so_far(self.work_uri)
        if found is None:
            return

        def change(record: dict[str, Any]) -> dict[str, Any] | None:
            counts = record["request_counts"]
            if record["status"] not in ("in_progress", "cancelling"):
                return None
            # records, not lines (a several-input embeddings line is several): capped
            grown = {k: min(max(counts[k], v), counts["total"]) for k, v in found.items()}
            return (
                None
                if grown.items() <= counts.items()
                else {**record, "request_counts": {**counts, **grown}}
            )

        self.batches.update_batch(self.batch_id, change)
