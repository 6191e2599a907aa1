"""What a run shows while it goes and keeps for its report: the progress bar with a live
projection, the timeline of answered records, and each shard's start and finish.

The projection assumes the rest of the job runs at the rate measured since the first
answer (engine start-up excluded): finish time = now + records left / records per
second, and cost = price x gpus x (time so far + time left), the same formula the report
uses (``reports.report``).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from nightshift.jobs.spec import CostSpec
from nightshift.running.progresslines import progress_bar
from nightshift.running.totals import RunTotals

SAMPLE_SECONDS = 2.0  # one timeline point (and one postfix refresh) every this often
TAIL_SHARE = 0.9  # the tail: from this share of the run's records answered to all


class LiveProgress:
    """The run's clock, progress bar and timeline. Thread-safe: shard tasks may answer
    records from Prefect's worker threads."""

    def __init__(self, cost: CostSpec, show: bool, started: float | None = None) -> None:
        """``started``: the ``time.perf_counter()`` reading the run began at (now if None)."""
        self.cost, self.show = cost, show
        self.started = time.perf_counter() if started is None else started
        since = time.perf_counter() - self.started
        self.started_at = datetime.now(timezone.utc) - timedelta(seconds=since)
        self.samples: list[dict[str, float]] = [_sample(0.0, RunTotals())]
        self.shard_times: dict[int, dict[str, float]] = {}
        self.engine_startups: list[dict[str, float]] = []  # began_s, ready_s: this clock's
        self.canary: dict[str, float] | None = None  # began_s, ended_s, when one was measured
        self.expected = 0  # records this run will answer
        self._tail_marks: dict[str, float] = {}  # when 90% and 100% were answered
        self._first_answer: float | None = None
        self.last_work: float | None = None  # the last answer or commit: generation's end
        self._bar: Any = None  # tqdm, or ProgressLines when the screen is a log
        self._lock = threading.Lock()

    def now(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.started

    def expect(self, records: int) -> None:
        """Records this run will answer; the bar starts here."""
        with self._lock:
            self.expected = records
            if self._bar is None:  # a bar on a terminal, a line every 30 s in a log
                self._bar = progress_bar("generate", records, "records", show=self.show)

    def answered(self, shard: int, totals: RunTotals) -> None:
        """One more record answered (ok or failed); ``totals`` are the run's so far."""
        with self._lock:
            t = self.now()
            if self._first_answer is None:
                self._first_answer = t
            self.last_work = t
            self.shard_times.setdefault(shard, {"started_s": t})
            if self._bar is not None:
                self._bar.update(1)
            self._mark_tail(t, totals.ok + totals.failed)
            if t - self.samples[-1]["t_s"] >= SAMPLE_SECONDS:
                self.samples.append(_sample(t, totals))
                self._project(t, totals)

    def _mark_tail(self, t: float, answered: int) -> None:
        if answered >= TAIL_SHARE * self.expected:
            self._tail_marks.setdefault("share", t)
        if answered >= self.expected:
            self._tail_marks.setdefault("all", t)

    def tail_s(self) -> float | None:
        """Seconds from 90% of this run's records answered to all of them (None when the
        run answered none here; a scaled-out run's tail comes from its workers' timelines)."""
        marks = self._tail_marks
        return marks["all"] - marks["share"] if "all" in marks and "share" in marks else None

    def shard_done(self, shard: int, records: int) -> None:
        with self._lock:
            t = self.now()
            times = self.shard_times.setdefault(shard, {"started_s": t})
            times.update(finished_s=t, seconds=t - times["started_s"], records=records)
            self.last_work = t

    def projection(self, t: float, totals: RunTotals) -> dict[str, float] | None:
        """Rates so far and where they lead, or None before there is a rate."""
        answered = totals.ok + totals.failed
        busy = t - (self._first_answer if self._first_answer is not None else t)
        if not answered or busy <= 0:
            return None
        rate = answered / busy
        left_s = max(self.expected - answered, 0) / rate
        hours = (t + left_s) / 3600
        return {
            "records_per_s": rate,
            "tokens_per_s": totals.all_tokens / busy,
            "seconds_left": left_s,
            "usd": self.cost.usd_per_gpu_hour * self.cost.gpus * hours,
        }

    def _project(self, t: float, totals: RunTotals) -> None:
        p = self.projection(t, totals)
        if p is None or self._bar is None or not self.show:
            return
        finish = datetime.now().astimezone() + timedelta(seconds=p["seconds_left"])
        priced = f", ~${p['usd']:.4f}" if self.cost.usd_per_gpu_hour > 0 else ""  # not $0
        self._bar.set_postfix_str(
            f"{p['tokens_per_s']:,.0f} tok/s, done ~{finish:%H:%M:%S}{priced}", refresh=False
        )

    def close(self, totals: RunTotals) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            self.samples.append(_sample(self.now(), totals))

    def engines_started(self, spans: list[tuple[float, float]]) -> None:
        """Engine start-ups, from their (began, ready) ``perf_counter`` readings, onto
        this clock; one the head start began before the clock's 0 is clipped to it."""
        for began, ready in spans:
            self.engine_startups.append(
                {
                    "began_s": round(max(0.0, began - self.started), 3),
                    "ready_s": round(max(0.0, ready - self.started), 3),
                }
            )

    def canary_measured(self, began: float, ended: float) -> None:
        """The canary's two sample runs, from their ``perf_counter`` readings."""
        self.canary = {
            "began_s": round(began - self.started, 3),
            "ended_s": round(ended - self.started, 3),
        }

    def timeline(self) -> dict[str, Any]:
        """Cumulative counts over time (no samples for a run that answered nothing), and
        when each engine began starting and was ready (or gave up)."""
        answered = self.samples[-1]["records"] > 0
        return {
            "started_at": self.started_at.isoformat(),
            "samples": self.samples * answered,
            "engine_startups": sorted(self.engine_startups, key=lambda s: s["began_s"]),
            **({"canary": self.canary} if self.canary else {}),
            **self.answer_span(),
        }

    def answer_span(self) -> dict[str, float]:
        """When this run's first answer came and its last answer or commit (report.png's
        waiting and generating phases); empty for a run that answered nothing."""
        if self._first_answer is None:
            return {}
        last = self.last_work if self.last_work is not None else self._first_answer
        return {"first_answer_s": round(self._first_answer, 3), "last_answer_s": round(last, 3)}

    def shard_table(self) -> list[dict[str, float]]:
        """Shards this run committed, with their first answer and commit times."""
        return [{"shard": s, **t} for s, t in sorted(self.shard_times.items()) if "finished_s" in t]


def _sample(t: float, totals: RunTotals) -> dict[str, float]:
    return {
        "t_s": round(t, 3),
        "records": totals.ok + totals.failed,
        "prompt_tokens": totals.prompt_tokens,
        "output_tokens": totals.output_tokens,
    }
