"""The Wilson interval, checked against a direct computation from the counts: the bounds
are the shares ``p`` at which the score test ``|k/n - p| / sqrt(p(1-p)/n)`` equals z,
found here by bisection, independent of the closed form in ``nightshift.intervals``."""

from __future__ import annotations

import pytest

from nightshift.intervals import Z95, describe, share_ci, wilson


def _score_bound(k: int, n: int, low: bool) -> float:
    observed = k / n

    def outside(p: float) -> bool:  # the score statistic at p exceeds z
        return abs(observed - p) > Z95 * (p * (1 - p) / n) ** 0.5

    lo, hi = (0.0, observed) if low else (observed, 1.0)
    if (low and k == 0) or (not low and k == n):
        return observed
    for _ in range(200):  # bisect the one crossing between the edge and the estimate
        mid = (lo + hi) / 2
        if outside(mid) == low:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (59, 64), (214, 397), (1, 3), (5, 46)])
def test_wilson_matches_the_score_test_bounds(k, n):
    low, high = wilson(k, n)
    assert low == pytest.approx(_score_bound(k, n, low=True), abs=1e-4)
    assert high == pytest.approx(_score_bound(k, n, low=False), abs=1e-4)
    assert 0.0 <= low <= k / n <= high <= 1.0


def test_a_canary_of_64_at_92_percent_is_about_seven_points_either_side():
    low, high = wilson(59, 64)
    assert 0.82 < low < 0.84 and 0.96 < high < 0.97


def test_no_records_no_interval_and_bad_counts_refused():
    assert wilson(0, 0) is None and share_ci(None, 10) is None and describe(None) == ""
    with pytest.raises(ValueError):
        wilson(5, 4)


def test_share_ci_and_its_words():
    assert share_ci(0.75, 8) == wilson(6, 8)
    assert describe((0.8123, 0.9341)) == "95% CI 81.2-93.4%"
