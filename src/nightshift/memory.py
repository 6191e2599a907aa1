"""Handing freed memory back to the system.

Reading a million records' input in batches frees far more than any step holds, but the
allocators keep it: Arrow's pool (mimalloc) keeps what reading freed, and glibc keeps
freed big blocks (its threshold for returning them at once rises as they are freed). A
plan step's peak then sat on top of the step before's leftovers: 0.25-0.3 GiB at a
million records, growing with the input.
"""

from __future__ import annotations

import ctypes
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
