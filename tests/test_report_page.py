"""report.md, the headline table and report.png, from hand-built reports."""

from __future__ import annotations

import copy
import io
import re

import pytest
from matplotlib.image import imread

from nightshift.reports.chart import (
    _draw,
    chart_bands,
    chart_png_bytes,
    throughput_over_time,
    write_chart,
)
from nightshift.reports.page import (
    duration,
    report_markdown,
    report_table,
    significant,
    usd,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sample(t_s: float, records: int, prompt: int, output: int) -> dict:
    return {"t_s": t_s, "records": records, "prompt_tokens": prompt, "output_tokens": output}


def shard(index: int, records: int, started_s: float, finished_s: float) -> dict:
    return {
        "shard": index,
        "records": records,
        "started_s": started_s,
        "finished_s": finished_s,
        "seconds": finished_s - started_s,
    }


@pytest.fixture
def report() -> dict:
    """A finished run: 246.24 s of wall time (0.0684 h) on one $2.99 GPU."""
    usd_total = 2.99 * 1 * 246.24 / 3600  # $0.204516
    tokens = {"prompt": 2_000_000, "prompt_cached": 500_000, "output": 250_000}
    return {
        "job": "tickets",
        "records": {"input": 10_000, "ok": 9_800, "rejected": 150, "failed": 50, "not_yet_run": 0},
        "tokens": {**tokens, "total": 2_250_000},
        "time_s": {"total": 246.24, "plan": 20.0, "engine_startup": 26.24, "generate": 200.0},
        "throughput": {
            "output_tokens_per_s": 1_250.0,
            "total_tokens_per_s": 11_250.0,
            "records_per_s": 49.25,
        },
        "cost": {
            "gpu": "h100",
            "gpus": 1,
            "usd_per_gpu_hour": 2.99,
            "gpu_hours": 0.0684,
            "usd_total": usd_total,
            "input_share": 0.6,
            "usd_per_million_tokens": {
                "input": usd_total * 0.6 / 2_000_000 * 1e6,  # 0.0613548
                "output": usd_total * 0.4 / 250_000 * 1e6,  # 0.3272256
                "total": usd_total / 2_250_000 * 1e6,  # 0.0908960
            },
            "formula": "usd_total = usd_per_gpu_hour x gpus x wall_hours",
        },
        "prefix_cache_hit_rate": 0.25,
        "finish_reasons": {"length": 50, "stop": 9_800},
        "engine": {"name": "vllm", "kv_cache_dtype": "fp8", "kv_cache_tokens": 500_000},
        "shards": {"count": 4, "committed": 4, "failed": {}, "complete": True},
        "this_run": {
            "attempt": "abc123",
            "shards_committed": [0, 1, 2, 3],
            "records_answered": 9_850,
            "tokens": tokens,
            "engine_starts": 1,
        },
        "prefix_reuse": {
            "predicted": 0.3,
            "measured": 0.25,
            "input_order_predicted": 0.1,
            "block_size": 16,
            "note": "",
        },
        "timeline": {
            "started_at": "2026-11-30T12:00:00+00:00",
            "samples": [
                sample(0.0, 0, 0, 0),
                sample(50.0, 2_000, 400_000, 50_000),
                sample(150.0, 7_000, 1_400_000, 175_000),
                sample(246.24, 9_850, 2_000_000, 250_000),
            ],
        },
        "shard_times": [
            shard(1, 2_500, 46.5, 120.0),
            shard(0, 2_500, 46.24, 100.0),
            shard(2, 2_500, 100.0, 160.0),
            shard(3, 2_350, 120.0, 246.0),
        ],
    }


@pytest.fixture
def old_report(report) -> dict:
    """A report from before timelines, shard times, prefix reuse and resuming."""
    old = copy.deepcopy(report)
    for key in ("timeline", "shard_times", "prefix_reuse", "this_run", "shards", "engine"):
        del old[key]
    del old["records"]["not_yet_run"], old["cost"]["input_share"]
    return old


def test_markdown_shows_the_reports_numbers(report):
    page = report_markdown(report)
    assert page.startswith("# tickets\n")
    assert "**9,800 ok, 150 rejected, 50 failed** of 10,000 input records" in page
    assert "4 of 4 shards committed" in page
    assert "| prompt tokens (in) | 2,000,000 | tokens |" in page
    assert "| cached prompt tokens | 500,000 | tokens |" in page
    assert "| prefix reuse, predicted | 30.0% | of prompt tokens |" in page
    assert "| prefix reuse, input order (predicted) | 10.0% | of prompt tokens |" in page
    assert "| generation | 200.0 | s |" in page
    assert "generation 81.2%" in page  # 200 of 246.24 s
    assert "| total tokens per second | 11,250 | tokens/s |" in page
    assert "| cost per million input tokens | $0.06135 | USD/1M tokens |" in page
    assert "| cost per million output tokens | $0.3272 | USD/1M tokens |" in page
    assert "| cost per million tokens | $0.09090 | USD/1M tokens |" in page
    for section in ("Tokens", "Time", "Throughput", "Cost", "Over time", "Shards"):
        assert f"\n## {section}\n" in page
    assert "![Throughput over time and time per shard](report.png)" in page


def test_markdown_says_cost_and_throughput_are_this_runs(report):
    page = report_markdown(report)
    assert "For this run, over its generation time." in page
    assert "For this run: its wall time" in page
    # A resumed run generated only part of the tokens: the page says which it counted.
    report["this_run"]["tokens"] = {"prompt": 1_000_000, "prompt_cached": 0, "output": 125_000}
    assert "This run generated 1,000,000 prompt and 125,000 output tokens" in (
        report_markdown(report)
    )


def test_cost_formula_is_worked_out_with_the_reports_numbers(report):
    page = report_markdown(report)
    assert "How: usd_total = usd_per_gpu_hour x gpus x wall_hours." in page
    line = "usd_total = usd_per_gpu_hour x gpus x wall hours = $2.99 x 1 x 0.06840 h = $0.2045"
    assert line in page
    price, gpus, hours, total = map(float, re.findall(r"\d+\.?\d*", line.split("= ", 1)[1]))
    assert price * gpus * hours == pytest.approx(total, rel=1e-3)
    assert "$0.2045 / 2,250,000 x 1e6 = $0.09090" in page
    assert "$0.2045 x 60.0% / 2,000,000 x 1e6 = $0.06135" in page
    assert "$0.2045 x 40.0% / 250,000 x 1e6 = $0.3272" in page


def test_shard_table_lists_this_runs_shards_in_start_order(report):
    page = report_markdown(report)
    table = page[page.index("## Shards") :]
    assert "the slowest was shard 3 (126.0 s)" in table
    assert "| 0 | 2,500 | 53.8 | 46.5 | 12:00:46 (+46.2 s) |" in table
    assert table.index("| 0 |") < table.index("| 1 |") < table.index("| 3 |")


def test_an_old_report_renders_without_its_missing_sections(old_report):
    page = report_markdown(old_report)
    assert "**9,800 ok, 150 rejected, 50 failed** of 10,000 input records." in page
    assert "$2.99 x 1 x 0.06840 h = $0.2045" in page
    # Without input_share the split follows the prompt tokens' share of all tokens.
    assert "x 88.9% / 2,000,000 x 1e6" in page
    for absent in ("## Shards", "## Over time", "prefix reuse", "![", "shards committed"):
        assert absent not in page
    assert chart_png_bytes(old_report) is None


def test_no_chart_link_without_a_chart_name(report):
    assert "![" not in report_markdown(report, chart_name=None)
    assert "](charts/run.png)" in report_markdown(report, chart_name="charts/run.png")


def test_table_rows_are_the_headline_figures(report):
    rows = report_table(report)
    assert all(set(row) == {"metric", "value", "unit"} for row in rows)
    values = {row["metric"]: (row["value"], row["unit"]) for row in rows}
    assert values["ok"] == ("9,800", "records")
    assert values["not yet run"] == ("0", "records")
    assert values["shards committed"] == ("4", "of 4")
    assert values["output tokens (out)"] == ("250,000", "tokens")
    assert values["prefix-cache hit rate"] == ("25.0%", "of prompt tokens")
    assert values["wall time"] == ("246.2", "s")
    assert values["records per second"] == ("49.2", "records/s")
    assert values["total cost"] == ("$0.2045", "USD")
    assert values["GPU hours"] == ("0.06840", "GPU-hours")
    assert values["cost per million output tokens"] == ("$0.3272", "USD/1M tokens")
    # The page shows the same rows.
    page = report_markdown(report)
    for row in rows:
        assert f"| {row['metric']} | {row['value']} | {row['unit']} |" in page


def test_table_of_an_old_report_leaves_out_what_it_lacks(old_report):
    metrics = {row["metric"] for row in report_table(old_report)}
    assert {"ok", "total cost", "cost per million tokens"} <= metrics
    assert not {"not yet run", "shards committed", "prefix reuse, measured"} & metrics


def test_numbers_are_formatted_for_people():
    assert usd(0.0) == "$0.00"
    assert usd(0.2045160) == "$0.2045"
    assert usd(0.005817091) == "$0.005817"
    assert usd(1234.5) == "$1,234.50"
    assert significant(0.0684) == "0.06840"
    assert duration(18.46) == "18.5 s"
    assert duration(246.24) == "4 min 06 s"
    assert duration(7380) == "2 h 03 min"


def test_throughput_over_time_from_cumulative_samples():
    samples = [
        sample(0.0, 0, 0, 0),
        sample(2.0, 100, 10_000, 100),
        sample(2.0, 150, 15_000, 150),  # no time passed: its counts go to the next interval
        sample(6.0, 300, 30_000, 500),
    ]
    first, second = throughput_over_time(samples)
    assert (first["start_s"], first["end_s"]) == (0.0, 2.0)
    assert first["records_per_s"] == pytest.approx(50.0)
    assert first["output_tokens_per_s"] == pytest.approx(50.0)
    assert first["total_tokens_per_s"] == pytest.approx((10_000 + 100) / 2)
    assert (second["start_s"], second["end_s"]) == (2.0, 6.0)
    assert second["records_per_s"] == pytest.approx(200 / 4)
    assert second["output_tokens_per_s"] == pytest.approx(400 / 4)
    assert second["total_tokens_per_s"] == pytest.approx((20_000 + 400) / 4)
    assert throughput_over_time([]) == []
    assert throughput_over_time([sample(1.0, 5, 5, 5)]) == []


def test_chart_is_a_png_of_the_fixed_size(report, tmp_path):
    png = chart_png_bytes(report)
    assert png.startswith(PNG_MAGIC)
    assert imread(io.BytesIO(png)).shape[:2] == (900, 1000)
    assert write_chart(report, tmp_path / "report.png") is True
    assert (tmp_path / "report.png").read_bytes().startswith(PNG_MAGIC)
    buffer = io.BytesIO()
    assert write_chart(report, buffer) is True
    assert buffer.getvalue().startswith(PNG_MAGIC)


def test_chart_without_shard_times_or_with_many_shards(report):
    del report["shard_times"]
    assert chart_png_bytes(report).startswith(PNG_MAGIC)
    report["shard_times"] = [shard(i, 10, i * 0.5, i * 0.5 + 30) for i in range(60)]
    assert imread(io.BytesIO(chart_png_bytes(report))).shape[:2] == (900, 1000)


def test_no_chart_without_a_timeline(report, tmp_path):
    report["timeline"]["samples"] = []
    assert chart_png_bytes(report) is None
    assert write_chart(report, tmp_path / "report.png") is False
    assert not (tmp_path / "report.png").exists()
    assert "![" not in report_markdown(report)
    del report["timeline"]
    assert chart_png_bytes(report) is None


def legend_labels(report: dict) -> list[str]:
    """The legend's entries (the phases and records/s, under the title), as drawn."""
    return [t.get_text() for t in _draw(report).legends[0].get_texts()]


def test_chart_shows_engine_start_up_as_a_band_beside_planning(report):
    report["time_s"]["prepare"] = 2.0  # planning begins after nightshift's own start-up
    report["timeline"]["engine_startups"] = [
        {"began_s": 0.5, "ready_s": 40.0},  # two workers' engines, starting together
        {"began_s": 1.0, "ready_s": 46.0},
        {"began_s": 150.0, "ready_s": 170.0},  # a restart after a crash
        {"began_s": 200.0, "ready_s": 200.0},  # no time: nothing to draw
    ]
    assert chart_bands(report) == [
        {"label": "nightshift and Prefect start-up", "start_s": 0.0, "end_s": 2.0},
        {"label": "planning", "start_s": 2.0, "end_s": 22.0},
        {"label": "engine start-up", "start_s": 0.5, "end_s": 46.0},
        {"label": "engine start-up", "start_s": 150.0, "end_s": 170.0},
    ]
    assert legend_labels(report) == [
        "nightshift and Prefect start-up",
        "planning",
        "engine start-up",
        "records/s",
    ]
    assert imread(io.BytesIO(chart_png_bytes(report))).shape[:2] == (900, 1000)


def test_a_report_without_engine_start_ups_draws_planning_alone(report, old_report):
    assert "engine_startups" not in report["timeline"]  # a report.json from before them
    assert chart_bands(report) == [{"label": "planning", "start_s": 0.0, "end_s": 20.0}]
    assert legend_labels(report) == ["planning", "records/s"]
    assert chart_png_bytes(report).startswith(PNG_MAGIC)
    assert chart_bands(old_report) == chart_bands(report)
    report["time_s"]["plan"] = 0.0
    assert chart_bands(report) == []
    assert legend_labels(report) == ["records/s"]


def test_a_measured_canary_is_a_band_of_its_own(report):
    report["timeline"]["canary"] = {"began_s": 22.0, "ended_s": 80.0}
    assert chart_bands(report)[-1] == {"label": "canary", "start_s": 22.0, "end_s": 80.0}
    assert legend_labels(report) == ["planning", "canary", "records/s"]
    assert imread(io.BytesIO(chart_png_bytes(report))).shape[:2] == (900, 1000)


def test_report_chart_0_writes_no_chart_and_drops_an_old_one(report, tmp_path, monkeypatch):
    from nightshift.io.outputs import JobOutput
    from nightshift.reports.files import write_report_files

    output = JobOutput(str(tmp_path / "out"))
    monkeypatch.setenv("NIGHTSHIFT_REPORT_CHART", "1")
    write_report_files(output, copy.deepcopy(report))
    assert (tmp_path / "out" / "report.png").read_bytes().startswith(PNG_MAGIC)
    assert "](report.png)" in (tmp_path / "out" / "report.md").read_text()
    monkeypatch.setenv("NIGHTSHIFT_REPORT_CHART", " False ")
    written = copy.deepcopy(report)
    write_report_files(output, written)
    assert not (tmp_path / "out" / "report.png").exists()
    assert "![" not in (tmp_path / "out" / "report.md").read_text()
    assert "chart" not in written and written["report"].endswith("report.json")
