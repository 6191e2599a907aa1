"""95% intervals on shares (accuracy, agreement, flips): the Wilson score interval.

Why Wilson and not ``p ± 1.96·sqrt(p(1-p)/n)``: the normal interval collapses to a point
at 0% and 100% (a canary with 64 of 64 agreeing would read "100% ± 0") and spills below 0
and above 1 on small samples; Wilson's stays inside [0, 1] and keeps its coverage near
95% for the sample sizes a canary or a tune measures (tens to a few hundred records).
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the two-sided 95% quantile of the standard normal


def wilson(successes: int, total: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of ``successes`` in ``total`` (None when ``total`` is 0),
    each bound rounded to four places."""
    if total <= 0:
        return None
    if not 0 <= successes <= total:
        raise ValueError(f"{successes} successes of {total} is not a share")
    p = successes / total
    z2 = z * z
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = z * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total)) / (1 + z2 / total)
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


def share_ci(share: float | None, total: int) -> tuple[float, float] | None:
    """The interval of a share already computed as ``successes / total``."""
    if share is None or total <= 0:
        return None
    return wilson(round(share * total), total)


def describe(interval: tuple[float, float] | None) -> str:
    """``95% CI 81.2-93.4%``, or empty when there is no interval."""
    if interval is None:
        return ""
    return f"95% CI {interval[0]:.1%}-{interval[1]:.1%}".replace("%-", "-")
