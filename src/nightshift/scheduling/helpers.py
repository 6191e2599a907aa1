"""Processes that work beside a first plan: the jobs they are given, and their answers
kept in the order the plan gave the jobs.

The run's encoding processes are idle while the plan is built (``running.encoding``
lends them). Plan steps hand them jobs: a slice of input to measure
(``firstpass.MeasureSlice``), the records whose next chunks are read
(``prefixes.ChunkEnds``) and those whose shared starts are encoded
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

import polars as pl

from nightshift.scheduling.measure import RecordMeasurer

AHEAD_PER_HELPER = 3  # jobs given, or being run, ahead of the answers kept
# The records of jobs out at helpers, at most (a job's records are kept until it is
# answered: a helper that dies leaves it to be run here). 100,000 questions over 6 KB
# documents held 0.6-0.8 GB more in the plan's process before this bound.
HELD_BYTES = 128 << 20
# A job of longer records than this (on average) runs here: moving them (pickled, piped,
# read back) costs more than measuring them where a few documents lead many prompts
# (100,000 questions over 200 documents of 6 KB planned in 11.3-11.7 s with a helper
# against 7.4-7.9 alone); demo tickets are about 300 bytes.
SENT_BYTES_PER_RECORD = 2048


class HelperJob(Protocol):
    """A plan step's job for a helper: picklable (its records as polars frames)."""

    block_size: int  # a helper keeps one measurer per block size
    records: pl.DataFrame  # what it is run on

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
    whether a helper gave it) in the order the jobs came. An error raised here is
    raised in that order too: the plan fails on its first bad record, as alone."""

    def __init__(self, helpers: Helpers | None, keep: Callable[[Any, bool], None]) -> None:
        self.helpers = helpers if helpers is not None and helpers.count else None
        self.keep = keep
        self.waiting: deque[_Waiting] = deque()
        self.at_most = AHEAD_PER_HELPER * (1 + (self.helpers.count if self.helpers else 0))
        self.held = 0  # bytes of the records of jobs out at helpers

    def add(self, job: HelperJob | None, here: Callable[[], Any]) -> None:
        """``job`` given to a helper, or ``here()`` run now (``job`` None: here only)."""
        sent = None
        if job is not None and self.helpers and _worth_sending(job):
            sent = self.helpers.submit(job)
        if job is not None and sent is not None:
            size = job.records.estimated_size()
            self.waiting.append(_Waiting(sent, here, size))
            self.held += size
        else:
            self.waiting.append(_Waiting.run(here))
        while self.waiting and (self._full() or self.waiting[0].done()):
            self._keep_head()

    def finish(self) -> None:
        while self.waiting:
            self._keep_head()

    def _full(self) -> bool:
        return len(self.waiting) > self.at_most or self.held > HELD_BYTES

    def _keep_head(self) -> None:
        head = self.waiting.popleft()
        self.held -= head.size
        answer, by_helper = head.answer()
        self.keep(answer, by_helper)


def _worth_sending(job: HelperJob) -> bool:
    """Whether moving ``job``'s records to a helper costs less than running it here."""
    height = job.records.height
    return bool(height) and job.records.estimated_size() <= SENT_BYTES_PER_RECORD * height


class _Waiting:
    """A job given out (``sent``, with ``here`` to run it here if its helper cannot), or
    run here already (its answer, or the error it raised)."""

    def __init__(self, sent: Answer | None, here: Callable[[], Any] | None, size: int) -> None:
        self.sent, self.here, self.size = sent, here, size
        self.answered: Any = None
        self.error: BaseException | None = None

    @classmethod
    def run(cls, here: Callable[[], Any]) -> _Waiting:
        done = cls(None, None, 0)  # ``here`` is not kept: nor are the records it holds
        try:
            done.answered = here()
        except Exception as exc:  # noqa: BLE001 - raised in its turn (``answer``)
            done.error = exc
        return done

    def done(self) -> bool:
        return self.sent is None or self.sent.done()

    def answer(self) -> tuple[Any, bool]:
        """The answer, and whether a helper gave it; a job run here raises its error."""
        if self.error is not None:
            raise self.error
        if self.sent is None:
            return self.answered, False
        answer = self.sent.result()
        if answer is None:  # its helper could not: run here after all
            return self.here(), False  # type: ignore[misc]
        return answer, True
