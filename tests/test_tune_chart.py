"""tune.png readable without a GPU price: speed instead of $0, no name over another,
no axis below zero."""

from __future__ import annotations

import itertools

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from nightshift.reports.tunechart import label_heights, tune_figure
from nightshift.tuning.files import chart_png


def candidate(name: str, tokens_per_s: float, agreement: float, usd: float) -> dict:
    return {
        "name": name,
        "tokens_per_s": tokens_per_s,
        "usd_per_million_tokens": usd,
        "agreement": agreement,
    }


def summary(usd_per_gpu_hour: float) -> dict:
    """Six candidates, five on one spot (settings that change nothing measurable)."""
    price = usd_per_gpu_hour / 3600 * 1e6
    same = [("reference", 1.0), ("job", 1.0), ("max_num_seqs=128", 1.0)]
    same += [("max_num_seqs=512", 1.0), ("max_num_batched_tokens=4096", 1.0)]
    entries = [candidate(n, 1000.0, a, round(price / 1000.0, 4)) for n, a in same]
    entries.append(candidate("kv_cache_dtype=fp8", 1400.0, 0.84, round(price / 1400.0, 4)))
    entries.append({"name": "speculation", "error": "RuntimeError: not on this hardware"})
    return {
        "job": "tickets",
        "price": {"usd_per_gpu_hour": usd_per_gpu_hour, "gpus": 1},
        "candidates": entries,
        "chosen": {"name": "job"},
    }


def names_drawn(figure) -> dict[str, object]:
    FigureCanvasAgg(figure).draw()
    return {t.get_text(): t for t in figure.axes[0].texts}


def test_without_a_price_speed_is_plotted_and_no_name_covers_another():
    figure = tune_figure(summary(0.0))
    axes = figure.axes[0]
    assert "tokens per second" in axes.get_xlabel()
    assert "cost.usd_per_gpu_hour" in axes.get_xlabel()  # says why it is not cost
    assert axes.get_xlim()[0] == 0  # never a negative axis
    xs = sorted(float(x) for c in axes.collections for x, _ in c.get_offsets())
    assert 1000.0 in xs and 1400.0 in xs  # the points where they were measured
    drawn = names_drawn(figure)
    assert set(drawn) == {
        "reference",
        "job",
        "max_num_seqs=128",
        "max_num_seqs=512",
        "max_num_batched_tokens=4096",
        "kv_cache_dtype=fp8",
    }
    boxes = {n: Text.get_window_extent(t) for n, t in drawn.items()}  # the words, not the line
    for (a, box), (b, other) in itertools.combinations(boxes.items(), 2):
        assert not box.overlaps(other), f"{a} overlaps {b}"
    inside = figure.bbox
    assert all(inside.contains(b.x1, b.y1) and inside.contains(b.x0, b.y0) for b in boxes.values())


def test_with_a_price_cost_is_plotted_from_zero():
    figure = tune_figure(summary(2.99))
    axes = figure.axes[0]
    assert axes.get_xlabel().startswith("USD per million tokens")
    assert axes.get_xlim()[0] == 0
    assert chart_png(summary(2.99)).startswith(b"\x89PNG")
    assert chart_png({**summary(0.0), "candidates": []}) is None


def test_names_keep_their_gap_and_stay_inside():
    wanted = [0.95, 0.95, 0.95, 0.95, 0.2]
    placed = label_heights(sorted(wanted), 0.1)
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(placed))
    assert placed[0] == pytest.approx(0.2) and placed[-1] <= 0.95
    crowd = label_heights([0.5] * 30, 0.1)  # more than fit: they share the height
    assert min(crowd) >= 0 and max(crowd) <= 1
    assert all(b > a for a, b in itertools.pairwise(crowd))


def test_a_missing_agreement_is_never_drawn_as_zero():
    mixed = summary(0.0)
    mixed["candidates"][1]["agreement"] = None  # "job": nothing to compare
    figure = tune_figure(mixed)
    assert "job" not in names_drawn(figure)
    assert any("not compared with the reference: job" in t.get_text() for t in figure.texts)
    ys = [float(y) for c in figure.axes[0].collections for _, y in c.get_offsets()]
    assert 0.0 not in ys
    none = summary(0.0)
    for entry in none["candidates"]:
        entry["agreement"] = None
    bars = tune_figure(none)
    assert "agreement not measured" in bars.axes[0].get_title()
    assert len(bars.axes[0].patches) == 6 and bars.axes[0].get_xlim()[0] == 0
