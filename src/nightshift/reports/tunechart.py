"""tune.png: each candidate's agreement with the reference against what it costs.

With a GPU price (``cost.usd_per_gpu_hour``) the cost is USD per million tokens; without
one every candidate would cost $0, so the chart plots what was measured instead: tokens
per second (higher is better). The best trade-offs are drawn filled (no other candidate
is both cheaper, or faster, and agrees as often), the chosen one ringed.

Candidates often sit on one spot (settings that change nothing measurable), so names are
not written beside their points, where they would cover each other: they stand in a
column right of the plot, in the points' order from top to bottom, spaced so no two
touch, each with a line to its point. The cost axis starts at 0, never below.
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

LABEL_GAP = 0.075  # axes heights between two names in the column (8-point text)
FILLED, RING = "tab:blue", "tab:red"


def tune_chart_png(summary: dict[str, Any]) -> bytes | None:
    """The chart as PNG bytes; None when no candidate ran."""
    figure = tune_figure(summary)
    if figure is None:
        return None
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return buffer.getvalue()


def axis_for(summary: dict[str, Any]) -> tuple[str, str, bool]:
    """The x axis: (figure key, axis label, lower is better). Cost when there is a price,
    else tokens/s, since every cost would read $0."""
    priced = (summary.get("price") or {}).get("usd_per_gpu_hour", 0) > 0
    ran = _ran(summary, "usd_per_million_tokens")
    if priced and any(e["usd_per_million_tokens"] for e in ran):
        return (
            "usd_per_million_tokens",
            "USD per million tokens (generation, at the spec's price)",
            True,
        )
    return (
        "tokens_per_s",
        "tokens per second, prompt + output (no GPU price set: cost.usd_per_gpu_hour)",
        False,
    )


def tune_figure(summary: dict[str, Any]) -> Figure | None:
    key, label, lower_better = axis_for(summary)
    measured = _ran(summary, key)
    if not measured:
        return None
    ran = [e for e in measured if e.get("agreement") is not None]
    if not ran:  # nothing to compare (sampled answers): speed or cost alone, as bars
        return _bars(summary, measured, key, label)
    figure = Figure(figsize=(9, 4.8), dpi=100)
    figure.subplots_adjust(left=0.11, right=0.66, bottom=0.13, top=0.9)
    axes = figure.add_subplot()
    apart = [e["name"] for e in measured if e.get("agreement") is None]
    if apart:  # a missing agreement is not 0%: named, not drawn
        figure.text(0.01, 0.01, "not compared with the reference: " + ", ".join(apart), fontsize=7)
    best = frontier(ran, key, lower_better)
    chosen = (summary.get("chosen") or {}).get("name")
    points = [(e["name"], e[key], e["agreement"]) for e in ran]
    for name, x, y in points:
        axes.scatter(x, y, s=60, c=FILLED if name in best else "white", edgecolors=FILLED)
        if name == chosen:
            axes.scatter(x, y, s=220, facecolors="none", edgecolors=RING)
    top = max(x for _, x, _ in points)
    axes.set_xlim(0, top * 1.1 if top > 0 else 1.0)  # never a negative cost or speed
    lowest = min(y for _, _, y in points)
    axes.set_ylim(max(0.0, lowest - 0.1) - 0.01, 1.02)  # room to tell close figures apart
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes.set_xlabel(label, fontsize=8)
    axes.set_ylabel("agreement with the reference")
    what = "cost" if lower_better else "speed"
    axes.set_title(
        f"{summary['job']}: quality against {what} (filled: best trade-offs, ringed: chosen)",
        fontsize=9,
    )
    _name_column(axes, points)
    return figure


def _bars(summary: dict[str, Any], ran: list[dict[str, Any]], key: str, label: str) -> Figure:
    """Each candidate's speed (or cost) when no agreement was measured (sampled answers
    never agree twice): a bar each, from 0, the choice in red."""
    figure = Figure(figsize=(9, 1.6 + 0.35 * len(ran)), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    chosen = (summary.get("chosen") or {}).get("name")
    names = [e["name"] for e in ran]
    colours = [RING if n == chosen else FILLED for n in names]
    bars = axes.barh(range(len(ran)), [e[key] for e in ran], color=colours, height=0.6)
    axes.bar_label(bars, labels=[f"{e[key]:,.4g}" for e in ran], padding=3, fontsize=8)
    axes.set_yticks(list(range(len(ran))), names, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlim(left=0)
    axes.set_xlabel(label, fontsize=8)
    axes.set_title(
        f"{summary['job']}: agreement not measured (nothing to compare), red: chosen",
        fontsize=9,
    )
    return figure


def _ran(summary: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [e for e in summary["candidates"] if e.get(key) is not None and "error" not in e]


def _name_column(axes, points: list[tuple[str, float, float]]) -> None:
    """Each name right of the plot, at its point's height where there is room, with a
    line to the point."""
    low, high = axes.get_ylim()
    order = sorted(points, key=lambda p: (p[2], -p[1]))  # bottom to top
    wanted = [(y - low) / (high - low) for _, _, y in order]
    for (name, x, y), at in zip(order, label_heights(wanted, LABEL_GAP), strict=True):
        axes.annotate(
            name,
            xy=(x, y),
            xycoords="data",
            xytext=(1.03, at),
            textcoords="axes fraction",
            va="center",
            fontsize=8,
            arrowprops={"arrowstyle": "-", "color": "0.6", "linewidth": 0.6},
        )


def label_heights(wanted: list[float], gap: float) -> list[float]:
    """Heights (axes fractions, 0 to 1) for names wanted at ``wanted`` (ascending): each
    as near its own as the ``gap`` to its neighbours allows. A crowd that would run over
    the top is pushed down; more names than fit share the height evenly."""
    count = len(wanted)
    if count == 0:
        return []
    gap = min(gap, 1.0 / count)
    placed: list[float] = []
    for want in wanted:  # upwards: each at least a gap above the one below
        placed.append(max(want, placed[-1] + gap) if placed else max(want, gap / 2))
    ceiling = 1.0 - gap / 2
    for k in range(count - 1, -1, -1):  # downwards: under the top and the one above
        limit = ceiling if k == count - 1 else placed[k + 1] - gap
        placed[k] = min(placed[k], limit)
    return placed


def frontier(entries: list[dict[str, Any]], key: str, lower_better: bool) -> set[str]:
    """Candidates no other beats on both ``key`` and agreement."""

    def score(e: dict[str, Any]) -> tuple[float, float]:
        x = e[key]
        return (-x if lower_better else x, e["agreement"] or 0.0)

    def beaten(e: dict[str, Any]) -> bool:
        mine = score(e)
        return any(
            o is not e and (s := score(o))[0] >= mine[0] and s[1] >= mine[1] and s != mine
            for o in entries
        )

    return {e["name"] for e in entries if not beaten(e)}
