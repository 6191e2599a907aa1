"""report.png: throughput over time and each shard's span, from a report dict.

Behind the panels over time, bands mark every phase of the run (``reports.phases``):
start-up, planning, engine start-up, the canary, waiting for the first answer,
generating and wrap-up; a report from before a phase was recorded is drawn without it.
``chart_bands`` lists them, so they can be checked as data.

The chart is drawn on a bare ``Figure`` with the Agg canvas, never through pyplot, so
importing or calling this changes no global matplotlib state (no backend switch, no
figure registry) in the caller's process. ``chart_png_bytes`` is the primary API: the
output may be on S3, so the caller writes the bytes wherever the report goes.
"""

from __future__ import annotations

import contextlib
import io
from datetime import datetime
from os import PathLike
from pathlib import Path
from typing import IO, Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from nightshift.reports.page import has_chart
from nightshift.reports.phases import run_phases
from nightshift.reports.qualitychart import has_quality_panel, quality_panel

# Pixel size is fixed (no tight bounding box) so every report's chart has the same shape.
WIDTH_IN, HEIGHT_IN, DPI = 10.0, 9.0, 100
# Past this many shards, per-bar labels overlap into noise (the panel is about 1.7 in
# tall: 12 rows of 8-point text); the bars alone still show the tail.
MAX_LABELLED_SHARDS = 12
RECORDS, OUTPUT, TOTAL, PLANNING, STARTUP, CANARY = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "0.85",
    "tab:purple",
    "tab:olive",
)
# Start-up often runs during planning (the engine starts while the plan is built): it is
# hatched over a pale tint, so the grey planning band still shows through where they meet.
BAND_STYLES = {
    "nightshift and Prefect start-up": {
        "facecolor": "0.93",
        "edgecolor": "0.6",
        "hatch": "..",
        "linewidth": 0,
        "zorder": 0,
    },
    "planning": {"color": PLANNING, "linewidth": 0, "zorder": 0},
    "engine start-up": {
        "facecolor": to_rgba(STARTUP, 0.15),  # faint, so the hatch reads over white
        "edgecolor": STARTUP,
        "hatch": "//",
        "linewidth": 0,
        "zorder": 0.5,
    },
    # The canary's two sample runs come after the plan and before the first answer: the
    # rest of a run's empty start. Its reference side starts an engine of its own.
    "canary": {"facecolor": to_rgba(CANARY, 0.2), "linewidth": 0, "zorder": 0.25},
    # The engine works, but no request has finished: answers of one batch come together.
    "waiting for the first answer": {
        "facecolor": to_rgba("tab:red", 0.1),
        "linewidth": 0,
        "zorder": 0,
    },
    "generating": {"facecolor": to_rgba(TOTAL, 0.07), "linewidth": 0, "zorder": 0},
    "wrap-up": {
        "facecolor": "0.96",
        "edgecolor": "0.75",
        "hatch": "--",
        "linewidth": 0,
        "zorder": 0,
    },
}
THOUSANDS = StrMethodFormatter("{x:,.0f}")


def throughput_over_time(samples: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Rates between consecutive cumulative samples: one interval per pair, with
    records/s, output tokens/s and total (prompt + output) tokens/s.

    A sample no later than the one before it is skipped; the counts are cumulative, so
    what it counted shows up in the next interval instead of being lost.
    """
    intervals = []
    previous = samples[0] if samples else None
    for sample in samples[1:]:
        seconds = sample["t_s"] - previous["t_s"]
        if seconds <= 0:
            continue
        prompt = sample["prompt_tokens"] - previous["prompt_tokens"]
        output = sample["output_tokens"] - previous["output_tokens"]
        intervals.append(
            {
                "start_s": previous["t_s"],
                "end_s": sample["t_s"],
                "records_per_s": (sample["records"] - previous["records"]) / seconds,
                "output_tokens_per_s": output / seconds,
                "total_tokens_per_s": (prompt + output) / seconds,
            }
        )
        previous = sample
    return intervals


def chart_bands(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The bands behind the panels over time, ``{"label", "start_s", "end_s"}`` on the
    run's clock: every phase of the run (``reports.phases``)."""
    return run_phases(report)


def chart_png_bytes(report: dict[str, Any]) -> bytes | None:
    """The chart as PNG bytes, or None when the report has no timeline to draw."""
    if not has_chart(report):
        return None
    figure = _draw(report)
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return buffer.getvalue()


def write_chart(report: dict[str, Any], path_or_buffer: str | PathLike | IO[bytes]) -> bool:
    """Write the chart to a local path or a binary file object; False (and nothing
    written) when the report has no timeline."""
    png = chart_png_bytes(report)
    if png is None:
        return False
    if hasattr(path_or_buffer, "write"):
        path_or_buffer.write(png)
    else:
        Path(path_or_buffer).write_bytes(png)
    return True


def _draw(report: dict[str, Any]) -> Figure:
    shards = sorted(report.get("shard_times") or [], key=lambda s: s["started_s"])
    quality = report.get("quality") if has_quality_panel(report) else None
    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    ratios = [1, 1, 1.3][: 3 if shards else 2] + ([1.6] if quality else [])
    grid = figure.add_gridspec(len(ratios), 1, height_ratios=ratios)
    first = figure.add_subplot(grid[0])
    rows = len(ratios) - (1 if quality else 0)  # the panels over time share one axis
    panels = [first] + [figure.add_subplot(grid[i], sharex=first) for i in range(1, rows)]
    intervals = throughput_over_time(report["timeline"]["samples"])
    _records_panel(panels[0], intervals, report)
    _tokens_panel(panels[1], intervals, report)
    if shards:
        _shard_panel(panels[2], shards, report)
    for axes in panels[:-1]:
        axes.tick_params(labelbottom=False)
    panels[-1].set_xlabel("seconds since the run started")
    if quality:
        quality_panel(figure.add_subplot(grid[-1]), quality)
    figure.suptitle(_title(report))
    # The phases and records/s in one legend at the foot, off the curves: a run
    # has up to seven phases, too many for a corner of a panel.
    handles, labels = panels[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=8)
    return figure


def _title(report: dict[str, Any]) -> str:
    title = f"{report['job']}: this run"
    started = report["timeline"].get("started_at")
    with contextlib.suppress(TypeError, ValueError):
        started = datetime.fromisoformat(started).strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    return title + (f", started {started}" if started else "")


def _records_panel(axes: Axes, intervals: list[dict], report: dict[str, Any]) -> None:
    _shade_bands(axes, report)
    axes.set_title("Records answered per second")
    axes.set_ylabel("records/s")
    if intervals:
        edges = _edges(intervals)
        rates = [i["records_per_s"] for i in intervals]
        axes.stairs(rates, edges, color=RECORDS, linewidth=1.5, label="records/s")
    axes.set_ylim(bottom=0)
    axes.yaxis.set_major_formatter(THOUSANDS)


def _tokens_panel(axes: Axes, intervals: list[dict], report: dict[str, Any]) -> None:
    """Output tokens/s on the left axis, total on the right: a short answer to a long
    prompt makes total a hundred times output, which would flatten output on one axis."""
    _shade_bands(axes, report)
    axes.set_title("Tokens per second")
    axes.set_ylabel("output tokens/s", color=OUTPUT)
    total_axes = axes.twinx()
    total_axes.set_ylabel("total tokens/s (prompt + output)", color=TOTAL)
    if intervals:
        edges = _edges(intervals)
        output = [i["output_tokens_per_s"] for i in intervals]
        total = [i["total_tokens_per_s"] for i in intervals]
        axes.stairs(output, edges, color=OUTPUT, linewidth=1.5, label="output tokens/s")
        # Dashed, so it stays visible where the two scaled lines coincide.
        total_axes.stairs(total, edges, color=TOTAL, linestyle="--", label="total tokens/s")
    for scale in (axes, total_axes):
        scale.set_ylim(bottom=0)
        scale.yaxis.set_major_formatter(THOUSANDS)
    # One legend for both axes, so the reader need not match colours across two boxes.
    # The phases are in the figure's legend already: here only the two lines.
    handles, labels = axes.get_legend_handles_labels()
    more_handles, more_labels = total_axes.get_legend_handles_labels()
    lines = [(h, n) for h, n in zip(handles + more_handles, labels + more_labels, strict=True)]
    lines = [(h, n) for h, n in lines if n not in BAND_STYLES]
    total_axes.legend(*zip(*lines, strict=True), loc="upper right", fontsize=8)


def _edges(intervals: list[dict]) -> list[float]:
    return [intervals[0]["start_s"], *(i["end_s"] for i in intervals)]


def _shard_panel(axes: Axes, shards: list[dict], report: dict[str, Any]) -> None:
    """Each shard from start to finish, in start order: stragglers and the tail, where
    the GPUs sit half idle, show as bars reaching past the rest."""
    _shade_bands(axes, report)
    positions = range(len(shards))
    bars = axes.barh(
        positions,
        [s["finished_s"] - s["started_s"] for s in shards],
        left=[s["started_s"] for s in shards],
        color=RECORDS,
        height=0.7,
    )
    axes.invert_yaxis()  # first started on top, like a Gantt chart
    axes.set_title("Time per shard, start to finish")
    if len(shards) <= MAX_LABELLED_SHARDS:
        axes.set_yticks(list(positions), [f"shard {s['shard']}" for s in shards], fontsize=8)
        labels = [f"{s['records']:,} records, {s['seconds']:,.1f} s" for s in shards]
        axes.bar_label(bars, labels=labels, padding=3, fontsize=7)
        axes.set_ylabel("shard")
    else:
        axes.set_yticks([])
        axes.set_ylabel(f"{len(shards):,} shards, in start order")


def _shade_bands(axes: Axes, report: dict[str, Any]) -> None:
    """The bands of ``chart_bands``; each kind in the legend once."""
    named = set()
    for band in chart_bands(report):
        label = band["label"]
        axes.axvspan(
            band["start_s"],
            band["end_s"],
            label="_nolegend_" if label in named else label,
            **BAND_STYLES[label],
        )
        named.add(label)
