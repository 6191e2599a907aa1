"""Shard commits on a thread of their own, so the engine is fed while a shard is written.

A shard's commit merges its chunks, writes its Parquet files and creates its marker
(``io.shardstore``): at 25,000 embeddings that is a quarter of a second of work, most of
it Arrow's and zstd's (which let go of the GIL). Done on the feeding thread it would
leave a GPU without new requests for that long at every shard boundary. Here the
feeding thread hands a finished shard over and goes on feeding; commits run one at a
time, in the order given, at most ``ahead`` waiting (the feeding thread waits beyond
that, so memory holds a bounded number of finished shards).

Nothing about durability changes: a shard counts as committed only once its marker
exists, exactly as before. A shard checkpoints the answers it holds before it is handed
over (``settling._finish``), so a kill while its commit waits loses none of them: a
rerun commits the shard from its checkpoints. A commit whose store fails settles its
shard as failed (``settling._commit_failed``: a retry or a rerun continues it from its
checkpoints); anything else a commit raises reaches the feeding thread at its next
``check`` (while it waits for work) or ``drain``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from nightshift.memory import give_back_freed

log = logging.getLogger(__name__)

COMMITS_AHEAD = 1  # finished shards waiting for the commit thread beyond the one it writes


class BackgroundCommits:
    """Runs commits one at a time on a thread of its own; ``check`` and ``drain`` raise
    what a commit raised."""

    def __init__(self, ahead: int = COMMITS_AHEAD) -> None:
        self.ahead = ahead
        self._pending: deque[Future] = deque()
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, commit: Callable[[], None]) -> None:
        """Run ``commit`` after those submitted before it; wait while ``ahead`` wait."""
        self.check()
        while len(self._pending) > self.ahead:
            self._pending.popleft().result()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="nightshift-commit")
        self._pending.append(self._pool.submit(_freeing_after, commit))

    def check(self) -> None:
        """Raise the error of a commit that has failed (cheap: no waiting)."""
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()

    def drain(self) -> None:
        """Wait for every commit submitted; raise the first that failed (logging any
        after it)."""
        try:
            while self._pending:
                self._pending.popleft().result()
        except BaseException:
            self.abandon_errors()
            raise
        self._close()

    def abandon_errors(self) -> None:
        """Wait for every commit, logging (not raising) their errors: another error is
        already on its way out."""
        try:
            while self._pending:
                try:
                    self._pending.popleft().result()
                except Exception as exc:  # noqa: BLE001 (the caller's error goes on)
                    log.error("a shard's commit failed too: %s", exc)
        finally:
            self._close()

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _freeing_after(commit: Callable[[], None]) -> None:
    """Run ``commit``, then hand back what it freed: Arrow's allocator keeps a thread's
    freed pages in that thread's own heap, and a commit of 100,000 embeddings frees
    several hundred MB (the merged table, the Parquet pages)."""
    try:
        commit()
    finally:
        give_back_freed()
