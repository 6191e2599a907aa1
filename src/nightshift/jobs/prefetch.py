"""Run a generator a few items ahead in a background thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


def prefetch(items: Iterator[T], depth: int) -> Iterator[T]:
    """Yield ``items`` while a thread computes up to ``depth`` more.

    An exception in the producer is raised here, in the consumer, at the point it would
    have been raised without the thread. Closing the consumer early stops the producer.
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                ready.put(item)
        except BaseException as exc:  # handed to the consumer, which raises it
            ready.put(_Failure(exc))
            return
        ready.put(_DONE)

    worker = threading.Thread(target=produce, name="nightshift-prefetch", daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                ready.get_nowait()
            except queue.Empty:
                worker.join(timeout=0.05)


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error
