"""Report arithmetic on hand-computed cases."""

from __future__ import annotations

import pytest

from nightshift.engines.base import EngineStats
from nightshift.jobs.spec import CostSpec
from nightshift.reports.report import RunTotals, Timings, build_report, prefill_share


def make_report(stats: EngineStats, total_s: float = 3600.0) -> dict:
    totals = RunTotals(
        input_records=10,
        ok=7,
        rejected=2,
        failed=1,
        prompt_tokens=800_000,
        prompt_tokens_cached=200_000,
        output_tokens=200_000,
    )
    times = Timings(total=total_s, plan=100.0, engine_startup=500.0, generate=3000.0)
    cost = CostSpec(gpu="h100", gpus=2, usd_per_gpu_hour=3.0)
    return build_report("job", totals, times, stats, None, cost)


def test_cost_bills_all_gpus_for_the_whole_wall_time():
    report = make_report(EngineStats(prefill_seconds=1.0, decode_seconds=3.0))
    cost = report["cost"]
    # 2 GPUs x $3/h x 1 h = $6, start-up and planning included.
    assert cost["usd_total"] == pytest.approx(6.0)
    assert cost["gpu_hours"] == pytest.approx(2.0)
    # $6 over 1,000,000 tokens.
    assert cost["usd_per_million_tokens"]["total"] == pytest.approx(6.0)
    # Prefill took 1/4 of engine time: $1.50 over 800k prompt tokens, $4.50 over 200k output.
    assert cost["input_share"] == pytest.approx(0.25)
    assert cost["usd_per_million_tokens"]["input"] == pytest.approx(1.875)
    assert cost["usd_per_million_tokens"]["output"] == pytest.approx(22.5)


def test_without_phase_times_the_split_follows_token_counts():
    report = make_report(EngineStats())
    per_m = report["cost"]["usd_per_million_tokens"]
    assert report["cost"]["input_share"] == pytest.approx(0.8)
    assert per_m["input"] == pytest.approx(per_m["total"]) == pytest.approx(per_m["output"])


def test_throughput_is_over_generation_time():
    report = make_report(EngineStats())
    assert report["throughput"]["output_tokens_per_s"] == pytest.approx(200_000 / 3000)
    assert report["throughput"]["total_tokens_per_s"] == pytest.approx(1_000_000 / 3000)
    assert report["time_s"]["engine_startup"] == 500.0


def test_hit_rate_prefers_the_engine_counters():
    with_counters = make_report(EngineStats(prefix_cache_queries=1000, prefix_cache_hits=100))
    assert with_counters["prefix_cache_hit_rate"] == pytest.approx(0.1)
    from_totals = make_report(EngineStats())
    assert from_totals["prefix_cache_hit_rate"] == pytest.approx(0.25)


def test_zero_tokens_gives_zero_prices_not_an_error():
    assert prefill_share(EngineStats(), 0, 0) == 0.0
    report = build_report("j", RunTotals(), Timings(1, 0, 0, 0), EngineStats(), None, CostSpec())
    assert report["cost"]["usd_per_million_tokens"] == {"input": 0.0, "output": 0.0, "total": 0.0}
