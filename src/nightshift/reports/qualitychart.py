"""report.png's quality panel (with ``eval``): the confusion matrix of a classify job,
or the scores of an extract or generate job, drawn on an ``Axes`` of ``reports.chart``."""

from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes

# Past this many labels the matrix cells are too small to read their counts.
MAX_ANNOTATED_LABELS = 12
BAR = "tab:purple"


def has_quality_panel(report: dict[str, Any]) -> bool:
    q = report.get("quality") or {}
    return bool(q) and not q.get("error") and q.get("records", {}).get("answered", 0) > 0


def quality_panel(axes: Axes, quality: dict[str, Any]) -> None:
    if quality["kind"] == "classify":
        _confusion(axes, quality)
    else:
        _scores(axes, quality)


def _confusion(axes: Axes, q: dict[str, Any]) -> None:
    """Counts of (true label, answer), true labels down, answers across: the diagonal is
    right, anything off it a confusion."""
    labels, matrix = q["confusion"]["labels"], q["confusion"]["matrix"]
    image = axes.imshow(matrix, cmap="Blues", aspect="auto")
    axes.figure.colorbar(image, ax=axes, label="records")
    ticks = range(len(labels))
    axes.set_xticks(list(ticks), labels, rotation=30, ha="right", fontsize=8)
    axes.set_yticks(list(ticks), labels, fontsize=8)
    axes.set_xlabel("answer")
    axes.set_ylabel("true label")
    if len(labels) <= MAX_ANNOTATED_LABELS:
        top = max((max(row) for row in matrix), default=0)
        for i, row in enumerate(matrix):
            for j, n in enumerate(row):
                colour = "white" if top and n > top / 2 else "black"
                axes.text(j, i, f"{n:,}", ha="center", va="center", fontsize=8, color=colour)
    macro = q.get("macro_f1")
    axes.set_title(
        f"Confusion matrix: accuracy {q['accuracy']:.1%}"
        + (f", macro F1 {macro:.3f}" if macro is not None else "")
        + f" ({q['records']['answered']:,} answered)"
    )


def _scores(axes: Axes, q: dict[str, Any]) -> None:
    """Each score as a share (chrF over 100), one bar each."""
    if q["kind"] == "extract":
        bars = {"valid JSON": q["valid_json_rate"], "exact match": q["exact_match_rate"]}
        bars.update({f"{k} exact": v["exact_match_rate"] for k, v in q["per_field"].items()})
    else:
        chrf = q.get("chrf")
        bars = {
            "exact match": q["exact_match_rate"],
            "chrF / 100": None if chrf is None else chrf / 100,
        }
    names = list(bars)
    values = [bars[n] or 0.0 for n in names]
    drawn = axes.barh(range(len(names)), values, color=BAR, height=0.6)
    axes.bar_label(drawn, labels=[f"{v:.1%}" for v in values], padding=3, fontsize=8)
    axes.set_yticks(list(range(len(names))), names, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlim(0, 1.1)
    axes.set_title(f"Quality ({q['records']['answered']:,} answered)")
