"""The shards waiting to be fed to a running engine, in the order they were submitted.

Shard tasks (``running.feeding``) put their shard here while the engine is busy with
earlier ones, so the engine never waits for a task to start; a shard that must run again
after an engine death goes back to the front. ``close`` says no more will come.
"""

from __future__ import annotations

import threading
from collections import deque


class ShardQueue:
    def __init__(self, shards: list[int] | None = None, closed: bool = False) -> None:
        self._shards: deque[int] = deque(shards or [])
        self._closed = closed
        self._changed = threading.Condition()

    def put(self, shard: int, front: bool = False) -> None:
        with self._changed:
            if front:
                self._shards.appendleft(shard)
            else:
                self._shards.append(shard)
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def take(self, wait: float | None = 0) -> int | None:
        """The next shard; None if none comes within ``wait`` seconds (0: do not wait,
        None: until one comes or the queue is closed)."""
        with self._changed:
            if not self._shards and not self._closed and wait != 0:
                self._changed.wait_for(lambda: self._shards or self._closed, timeout=wait)
            return self._shards.popleft() if self._shards else None

    @property
    def finished(self) -> bool:
        """Closed, and every shard taken."""
        with self._changed:
            return self._closed and not self._shards
