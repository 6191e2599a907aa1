"""What ``jobs tune`` writes: tune.json (every figure), tune.md (the table), tune.png
(quality against cost, the best trade-offs marked), and a tuned spec on ``--write``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

COLUMNS = (
    ("candidate", "name", "{}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("records/s", "records_per_s", "{:.2f}"),
    ("$/1M tokens", "usd_per_million_tokens", "{:.4f}"),
    ("$/1k records", "usd_per_1000_records", "{:.4f}"),
    ("agreement", "agreement", "{:.1%}"),
    ("accuracy", "accuracy", "{:.1%}"),
    ("bound by", "bound_by", "{}"),
    ("batch reached", "limit.measured.batch_reached", "{:,}"),
    ("KV peak", "limit.measured.kv_cache_peak", "{:.0%}"),
    ("preempted", "limit.measured.preemptions", "{:,}"),
    ("predicted bound", "limit.predicted.bound_by", "{}"),
    ("KV", "kv_cache_dtype", "{}"),
)


def table_lines(summary: dict[str, Any]) -> list[str]:
    """The candidates as a Markdown table (errors on their own row)."""
    lines = ["| " + " | ".join(h for h, _, _ in COLUMNS) + " |"]
    lines.append("|" + "|".join(" --- " for _ in COLUMNS) + "|")
    for entry in summary["candidates"]:
        if "error" in entry:
            lines.append(f"| {entry['name']} | did not run: {entry['error']} |")
            continue
        cells = [_cell(_at(entry, key), shape) for _, key, shape in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _at(entry: dict[str, Any], key: str) -> Any:
    """``entry``'s value at a dotted key (``limit.measured.batch_reached``), or None."""
    for part in key.split("."):
        entry = entry.get(part) if isinstance(entry, dict) else None
    return entry


def _cell(value: Any, shape: str) -> str:
    return "" if value is None else shape.format(value)


def markdown(summary: dict[str, Any]) -> str:
    s = summary["sample"]
    chosen = summary.get("chosen")
    head = [
        f"# Tune: {summary['job']}",
        "",
        f"Sample: {s['records']} of the job's {s['job_records']} records ({s['share']:.1%}), "
        "runs of consecutive records in plan order. Each candidate is one engine start; "
        "speed and cost are over generation (start-up left out). Agreement: the share of "
        "the reference's answers a candidate gives the same (reference: KV cache in the "
        "model's dtype, no speculation). Bound by: what held the run back as the engine "
        "measured it (KV cache full or preempting, the batch at engine.max_num_seqs, steps "
        "at engine.max_num_batched_tokens, else the larger of prefill and decode time); "
        f"predicted bound: {_predicted_for(summary)}.",
        "",
        *table_lines(summary),
        "",
    ]
    if chosen:
        gain = chosen.get("speedup_over_job")
        told = f", {gain:.2f}x the job's tokens/s" if gain else ""
        head.append(
            f"Chosen: **{chosen['name']}** (fastest with agreement at least "
            f"{summary['min_agreement']:.0%}{told}); sets {json.dumps(chosen['sets'])}."
        )
    else:
        head.append(f"No candidate kept agreement at {summary['min_agreement']:.0%} or more.")
    return "\n".join(head) + "\n"


def _predicted_for(summary: dict[str, Any]) -> str:
    for entry in summary["candidates"]:
        predicted = (entry.get("limit") or {}).get("predicted") or {}
        if predicted.get("gpu"):
            return f"the capacity planner's, for {predicted['gpu']} at the same settings"
        if predicted.get("note"):
            return predicted["note"]
    return "none"


def chart_png(summary: dict[str, Any]) -> bytes | None:
    """Agreement against cost per million tokens (tokens/s without a GPU price), a point
    per candidate, names in a column that never overlaps (``reports.tunechart``)."""
    from nightshift.reports.tunechart import tune_chart_png

    return tune_chart_png(summary)


def write_tune_files(folder: Path, summary: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tune.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder / "tune.md").write_text(markdown(summary))
    png = chart_png(summary)
    if png is not None:
        (folder / "tune.png").write_bytes(png)


def write_tuned_spec(path: Path, data: dict[str, Any], summary: dict[str, Any]) -> None:
    """The spec with the chosen setting, and a comment saying what was measured."""
    from nightshift.tuning.candidates import Candidate

    chosen = summary["chosen"]
    tuned = Candidate(chosen["name"], chosen["sets"]).applied(data)
    entry = next(e for e in summary["candidates"] if e["name"] == chosen["name"])
    gain = chosen.get("speedup_over_job")
    comment = [
        f"Tuned by `nightshift jobs tune` on {summary['sample']['records']} of "
        f"{summary['sample']['job_records']} records: chose {chosen['name']} "
        f"({json.dumps(chosen['sets'])}),",
        f"{entry['tokens_per_s']:,.0f} tokens/s"
        + (f" ({gain:.2f}x the spec as it was)" if gain else "")
        + f", agreement {entry['agreement']:.1%} with the reference answers.",
    ]
    text = "".join(f"# {line}\n" for line in comment) + yaml.safe_dump(tuned, sort_keys=False)
    path.write_text(text)
