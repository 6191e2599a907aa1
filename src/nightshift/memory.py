"""Handing freed memory back to the system.

Reading a million records' input in batches frees far more than any step holds, but the
allocators keep it: Arrow's pool (mimalloc) keeps what reading freed, and glibc keeps
freed big blocks (its threshold for returning them at once rises as they are freed). A
plan step's peak then sat on top of the step before's leftovers: 0.25-0.3 GiB at a
million records, growing with the input.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

import pyarrow as pa


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's
    except (OSError, AttributeError, TypeError):  # another C library (Windows: TypeError)
        return None


_TRIM = _malloc_trim()


def give_back_freed() -> None:
    """Return what Arrow's pool and the C heap hold free (under a millisecond): after an
    input batch is used and between plan steps. glibc's part is skipped where the C
    library has no ``malloc_trim``."""
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


_last = threading.local()


def give_back_now_and_then(every_s: float = 1.0) -> None:
    """``give_back_freed`` from a busy thread (the feed's, its prefetch's), at most once
    every ``every_s`` seconds on that thread: Arrow's pool keeps a thread's freed pages
    in that thread's heap, so only the thread itself hands them back, but glibc's trim
    walks every arena (about 2 ms in a run's process), too slow for every batch."""
    now = time.monotonic()
    if now - getattr(_last, "at", float("-inf")) >= every_s:
        _last.at = now
        give_back_freed()
