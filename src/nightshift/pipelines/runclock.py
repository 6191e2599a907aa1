"""When the run now starting began: set by the head start, read by the flow.

Its own module so that the flow, which the head start imports ahead of time, never
imports the head start back (``pipelines.headstart``)."""

from __future__ import annotations

import time

_clock: float | None = None  # the perf_counter reading the run being set up began at


def start_clock() -> None:
    global _clock
    _clock = time.perf_counter()


def stop_clock() -> None:
    global _clock
    _clock = None


def clock_start() -> float | None:
    """When the run now starting began, if ``head_start`` set it up (else None)."""
    return _clock
