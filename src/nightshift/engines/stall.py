"""The stall watchdog's clock: when an engine with requests in flight counts as hung."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class StallWatch:
    """Says when an engine is hung: for ``stall_s`` seconds spent inside its steps, no
    request finished and no token was generated. Only time in ``step()`` counts (a
    caller busy writing a checkpoint is not a hung engine), and ``tokens`` (vLLM's
    generated-token counter, costly to read) is asked only once half of ``stall_s``
    passed with no request finished. Without a token counter a returned step counts.
    Thread-safe enough: the run loop writes, one watchdog thread reads."""

    def __init__(
        self,
        stall_s: float | None,
        tokens: Callable[[], int | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stall_s, self._tokens, self._clock = stall_s, tokens, clock
        self.finished = 0  # requests finished, counted by the run loop
        self.steps = 0
        self._stepped = 0.0  # seconds spent in finished steps
        self._step_began: float | None = None
        self._seen: tuple[int, Any] = (0, None)  # (finished, tokens) at the last progress
        self._progress_at = 0.0  # engine seconds at the last progress

    def begin_step(self) -> None:
        self._step_began = self._clock()

    def end_step(self) -> None:
        began, self._step_began = self._step_began, None
        if began is not None:
            self._stepped += self._clock() - began
        self.steps += 1

    def engine_seconds(self) -> float:
        began = self._step_began
        return self._stepped + (self._clock() - began if began is not None else 0.0)

    def stalled(self) -> bool:
        if self.stall_s is None:
            return False
        now = self.engine_seconds()
        finished, tokens = self.finished, self._seen[1]
        if finished == self._seen[0]:  # nothing finished since the last progress
            if now - self._progress_at < self.stall_s / 2:
                return False  # not yet suspicious: leave the counter alone
            counted = self._tokens()
            tokens = counted if counted is not None else ("steps", self.steps)
        if (finished, tokens) != self._seen:
            self._seen, self._progress_at = (finished, tokens), now
            return False
        return now - self._progress_at >= self.stall_s
