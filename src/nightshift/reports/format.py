"""Numbers formatted for people, and the ``Section`` the page and the artifacts share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Section:
    """One part of the page: a heading, a sentence saying what it covers, its rows."""

    title: str
    note: str
    rows: list[dict[str, str]] = field(default_factory=list)

    def add(self, metric: str, value: str, unit: str = "") -> None:
        self.rows.append({"metric": metric, "value": value, "unit": unit})


# Numbers formatted for people.


def count(n: float) -> str:
    return f"{round(n):,}"


def percent(share: float) -> str:
    return f"{share:.1%}"


def significant(x: float, digits: int = 4) -> str:
    """``x`` with ``digits`` significant digits below 1 (0.005139), two decimals above
    (1,234.50): small prices and hours are unreadable when rounded to cents."""
    if x == 0:
        return "0"
    if abs(x) >= 1:
        return f"{x:,.2f}"
    decimals = min(12, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{decimals}f}"


def usd(x: float) -> str:
    return "$0.00" if x == 0 else f"${significant(x)}"


def rate(x: float) -> str:
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def duration(seconds: float) -> str:
    """18.5 s, 4 min 06 s, 2 h 03 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
