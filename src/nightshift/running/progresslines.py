"""Progress as plain lines, for a log: what a run shows when its screen is not a terminal.

A progress bar redrawn in place turns into noise in a log file (a CI job, ``nohup``, a
pipe), and a run that prints nothing for minutes looks hung. So when the screen is not a
terminal nightshift writes, as vLLM's run-batch and Ray Data write to their logs, one
line every ``every_s`` seconds (30 by default) and one at the end:

    generate: 120/400 records (30.0%) in 30 s, 4.00 records/s, ETA 1 min 10 s

``ProgressLines`` looks like a tqdm bar (``update``, ``set_postfix_str``, ``close``), so
code that drives a bar drives it unchanged; ``progress_bar`` picks one or the other. It
is time-based: between lines an update is an addition, one clock read and a comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

from nightshift.console import screen

EVERY_S = 30.0  # a line this often while work goes on, and one at the end


def screen_is_terminal() -> bool:
    """Whether nightshift's own lines reach a terminal (a bar) or a log (lines)."""
    try:
        return screen().isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: treat as a log
        return False


class ProgressLines:
    """Counts ``done`` of ``total`` and writes a line when ``every_s`` seconds have passed
    since the last one (the first ``every_s`` after the start), and at ``close``. The rate
    counts from the first unit done, so a slow start (an engine loading) does not drag the
    ETA; before any is done the line says it waits."""

    def __init__(
        self,
        label: str,
        total: int | None,
        unit: str = "records",
        every_s: float = EVERY_S,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
        self.n = 0
        self.postfix = ""
        self._stream, self._clock = stream, clock
        self.started = clock()
        self._next = self.started + every_s
        self._first: tuple[float, int] | None = None  # when the first unit was done
        self._closed = False
        self.write(self.started)  # a log shows at once that the work began

    def update(self, n: int = 1) -> None:
        """``n`` more units done (tqdm's ``update``): an addition and one clock read."""
        self.n += n
        now = self._clock()
        if now >= self._next or self._first is None:
            self._tick(now)

    def at(self, done: int) -> None:
        """``done`` units done so far; a line when one is due."""
        self.n = done
        self._tick(self._clock())

    def _tick(self, now: float) -> None:
        if self._first is None and self.n > 0:
            self._first = (now, self.n)
        if now >= self._next:
            self._next = now + self.every_s
            self.write(now)

    def set_postfix_str(self, text: str, refresh: bool = False) -> None:
        """Text after the figures (tqdm's ``set_postfix_str``): tokens/s, cost so far."""
        self.postfix = text

    def close(self) -> None:
        """The last line, once."""
        if not self._closed:
            self._closed = True
            self.write(self._clock())

    def write(self, now: float) -> None:
        stream = self._stream or screen()
        try:
            stream.write(self.line(now) + "\n")
            stream.flush()
        except (OSError, ValueError):  # a closed log: progress is a nicety, never a failure
            pass

    def line(self, now: float) -> str:
        """The line as of ``now`` (the clock's reading)."""
        done, total = self.n, self.total
        head = f"{self.label}: {done:,}" + (f"/{total:,}" if total else "") + f" {self.unit}"
        if total:
            head += f" ({done / total:.1%})"
        head += f" in {duration(now - self.started)}"
        rate = self._rate(now)
        if rate is None:
            head += ", waiting for the first" if not done else ", no rate yet"
        else:
            head += f", {rate:,.2f} {self.unit}/s"
            if total and done < total:
                head += f", ETA {duration((total - done) / rate)}"
        return head + (f", {self.postfix}" if self.postfix else "")

    def _rate(self, now: float) -> float | None:
        """Units per second since the first was done; None until more have come (a rate
        from one unit, over an engine's start-up, would promise a false ETA). The last
        line of a run whose units all came at once rates them over the whole time."""
        if self._first is None:
            return None
        since, before = self._first
        if self.n > before and now > since:
            return (self.n - before) / (now - since)
        if self._closed and now > self.started:
            return self.n / (now - self.started)
        return None

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def duration(seconds: float) -> str:
    """45 s, 4 min 06 s, 2 h 03 min (as report.md writes them)."""
    whole = round(max(seconds, 0.0))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def progress_bar(
    label: str, total: int | None, unit: str = "records", show: bool = True, every_s=EVERY_S
):
    """A tqdm bar on a terminal, ``ProgressLines`` (a line every ``every_s`` seconds) on a
    log, or a silent bar when not ``show``; each takes ``update``, ``set_postfix_str`` and
    ``close``."""
    from tqdm.auto import tqdm

    if show and not screen_is_terminal():
        return ProgressLines(label, total, unit, every_s)
    return tqdm(total=total, desc=label, unit=unit.rstrip("s"), disable=not show, file=screen())
