"""Processes that work beside a first plan: the jobs they are given, and their answers
kept in the order the plan gave the jobs.

The run's encoding processes are idle while the plan is built (``running.encoding``
lends them). Two plan steps hand them jobs: a slice of input to measure
(``firstpass.MeasureSlice``) and the records whose shared starts are encoded
(``prefixes.SharedStarts``). A job is a small picklable value run against a helper's
own ``RecordMeasurer`` (the same spec and tokenizer: the same answer as here). Where
no helper is free, or one could not answer (it died, or failed), the job runs here;
answers are taken in the order the jobs came, whoever ran them, so the plan is the same
with helpers or without.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from nightshift.scheduling.measure import RecordMeasurer

AHEAD_PER_HELPER = 3  # jobs given, or being run, ahead of the answers kept


class HelperJob(Protocol):
    """A plan step's job for a helper: picklable (its records as polars frames)."""

    block_size: int  # a helper keeps one measurer per block size

    def run(self, measurer: RecordMeasurer) -> Any: ...


class Answer(Protocol):
    """A job a helper runs: ``result`` waits for it, None where the helper could not."""

    def done(self) -> bool: ...

    def result(self) -> Any | None: ...


class Helpers(Protocol):
    """Processes lent to a first plan."""

    count: int  # how many there are

    def submit(self, job: HelperJob) -> Answer | None:
        """``job`` given to a free helper; None where none is free."""


class InOrder:
    """Jobs run by a free helper, else here; each answer handed to ``keep`` (with
    whether a helper gave it) in the order the jobs came."""

    def __init__(self, helpers: Helpers | None, keep: Callable[[Any, bool], None]) -> None:
        self.helpers = helpers if helpers is not None and helpers.count else None
        self.keep = keep
        self.waiting: deque[tuple[Answer | None, Callable[[], Any], Any]] = deque()
        self.at_most = AHEAD_PER_HELPER * (1 + (self.helpers.count if self.helpers else 0))

    def add(self, job: HelperJob | None, here: Callable[[], Any]) -> None:
        """``job`` given to a helper, or ``here()`` run now (``job`` None: here only)."""
        sent = self.helpers.submit(job) if self.helpers and job is not None else None
        self.waiting.append((sent, here, None if sent else here()))
        while self.waiting and (len(self.waiting) > self.at_most or self._head_done()):
            self._keep_head()

    def finish(self) -> None:
        while self.waiting:
            self._keep_head()

    def _head_done(self) -> bool:
        sent = self.waiting[0][0]
        return sent is None or sent.done()

    def _keep_head(self) -> None:
        sent, here, answer = self.waiting.popleft()
        if sent is None:
            self.keep(answer, False)
            return
        answer = sent.result()
        if answer is None:  # its helper could not: run here after all
            self.keep(here(), False)
        else:
            self.keep(answer, True)
