"""Run a generator ahead in a background thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
DONE = object()  # ``poll``: the producer has finished
EMPTY = object()  # ``poll``: nothing ready yet
_DONE = DONE


class Prefetch(Generic[T]):
    """Iterate ``items`` while a thread computes up to ``depth`` more.

    The thread starts at once, not at the first ``next``: a feed built before the
    engine starts gets its first batches rendered and encoded during engine start-up,
    when the CPU is otherwise idle. An exception in the producer is raised to the
    consumer where it would have been raised without the thread; ``close`` (or garbage
    collection of an abandoned iteration) stops the producer and closes ``items``, so
    what it holds open (a temporary copy, say) is released before ``close`` returns,
    also when nothing was ever consumed.
    """

    def __init__(self, items: Iterator[T], depth: int) -> None:
        self._ready: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._worker = threading.Thread(
            target=self._produce, args=(items,), name="nightshift-prefetch", daemon=True
        )
        self._worker.start()

    def _produce(self, items: Iterator[T]) -> None:
        try:
            for item in items:
                if self._stop.is_set():
                    return
                self._ready.put(item)
        except BaseException as exc:  # handed to the consumer, which raises it
            self._ready.put(_Failure(exc))
            return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # runs the generator's own clean-up now, in this thread
        self._ready.put(_DONE)

    def __iter__(self) -> Iterator[T]:
        try:
            while (item := self._ready.get()) is not _DONE:
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            self.close()

    def poll(self, timeout: float | None) -> object:
        """The next item; ``EMPTY`` when none is ready within ``timeout`` seconds (0: do
        not wait, None: wait for one); ``DONE`` once, at the end."""
        try:
            item = self._ready.get(timeout=timeout) if timeout != 0 else self._ready.get_nowait()
        except queue.Empty:
            return EMPTY
        if isinstance(item, _Failure):
            raise item.error
        return item

    def close(self) -> None:
        self._stop.set()
        while self._worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                self._ready.get_nowait()
            except queue.Empty:
                self._worker.join(timeout=0.05)


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error
