"""The shards waiting to be fed to a running engine, handed out in the plan's order.

Shard tasks (``running.feeding``) put their shard here while the engine is busy with
earlier ones, so the engine never waits for a task to start. Tasks reach ``put`` in a
race (Prefect sets each task run up in its own thread), so the order they arrive in is
not the order the plan chose (longest prompts first, shared prefixes together). The
queue therefore hands shards out in the order they were announced (``expect``),
whatever order they arrive in: a shard that arrives early waits for the shards
announced before it, for at most ``HOLD_S`` (a task that never runs must not stop the
others). A shard that must run again after an engine death goes back to the front.
``close`` says no more will come.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable

# How long a shard that arrived ahead of its turn waits for the ones announced before it.
# Tasks arrive within milliseconds of each other; the feed asks for its next shard while
# the engine still holds the current one's records, so a wait costs nothing unless an
# announced shard never comes.
HOLD_S = 2.0


class ShardQueue:
    def __init__(self, shards: list[int] | None = None, closed: bool = False) -> None:
        self._front: deque[int] = deque()  # put back after an engine death: first
        self._arrived: dict[int, float] = {}  # shard -> when it came, in arrival order
        self._expected: dict[int, int] = {}  # announced, not yet taken -> its turn
        self._turns = 0
        self._taken: set[int] = set()
        self._closed = closed
        self._changed = threading.Condition()
        for shard in shards or []:
            self.put(shard)

    def expect(self, shards: Iterable[int]) -> None:
        """Announce shards that will be put, in the order they are to be handed out."""
        with self._changed:
            for shard in shards:
                if shard not in self._expected:
                    self._expected[shard] = self._turns
                    self._turns += 1

    def put(self, shard: int, front: bool = False) -> None:
        """Queue ``shard``; one taken before (a retry) or put ``front`` goes first."""
        with self._changed:
            if front:
                self._front.appendleft(shard)
            elif shard in self._taken:
                self._front.append(shard)
            else:
                self._arrived[shard] = time.monotonic()
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def take(self, wait: float | None = 0) -> int | None:
        """The next shard; None if none is due within ``wait`` seconds (0: do not wait,
        None: until one is due or the queue is closed and empty)."""
        deadline = None if wait is None else time.monotonic() + wait
        with self._changed:
            while True:
                shard, due_in = self._next()
                if shard is not None:
                    self._take(shard)
                    return shard
                if self._closed and due_in is None:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                waits = [t for t in (left, due_in) if t is not None]
                self._changed.wait(min(waits) if waits else None)

    def _next(self) -> tuple[int | None, float | None]:
        """The shard to hand out now, or None and the seconds until one held back is due
        (None: nothing is waiting)."""
        if self._front:
            return self._front[0], None
        if not self._arrived:
            return None, None
        last = self._turns  # unannounced shards come after the announced, by arrival
        first = min(self._arrived, key=lambda s: self._expected.get(s, last))
        if self._closed or first not in self._expected or next(iter(self._expected)) == first:
            return first, None  # its turn, it has none, or no other will come
        held_for = time.monotonic() - self._arrived[first]
        if held_for < HOLD_S:
            return None, HOLD_S - held_for
        # The shards announced before it are not coming (their task never ran): stop
        # waiting for them; one that comes after all joins the others by arrival.
        turn = self._expected[first]
        self._expected = {s: t for s, t in self._expected.items() if t >= turn}
        return first, None

    def _take(self, shard: int) -> None:
        if self._front and self._front[0] == shard:
            self._front.popleft()
        else:
            del self._arrived[shard]
        self._expected.pop(shard, None)
        self._taken.add(shard)

    @property
    def finished(self) -> bool:
        """Closed, and every shard taken."""
        with self._changed:
            return self._closed and not self._front and not self._arrived
