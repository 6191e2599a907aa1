"""What ``jobs tune`` writes: tune.json (every figure), tune.md (the table), tune.png
(quality against cost, the best trade-offs marked), and a tuned spec on ``--write``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from nightshift.intervals import describe

CI = "{0[0]:.1%}-{0[1]:.1%}"  # a 95% interval's two bounds
ROUNDS = "rounds"  # each round's figure, " / " between them

COLUMNS = (
    ("candidate", "name", "{}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("rounds tokens/s", "rounds_tokens_per_s", ROUNDS),
    ("spread", "spread", "{:.1%}"),
    ("measurable", "measurable", "{}"),
    ("records/s", "records_per_s", "{:.2f}"),
    ("$/1M tokens", "usd_per_million_tokens", "{:.4f}"),
    ("$/1k records", "usd_per_1000_records", "{:.4f}"),
    ("agreement", "agreement", "{:.1%}"),
    ("agreement 95% CI", "agreement_ci", CI),
    ("accuracy", "accuracy", "{:.1%}"),
    ("accuracy 95% CI", "accuracy_ci", CI),
    ("right to wrong", "flips.right_to_wrong", "{:,}"),
    ("wrong to right", "flips.wrong_to_right", "{:,}"),
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
        shown = {**entry, "measurable": "no" if entry.get("not_measurable") else "yes"}
        cells = [_cell(_at(shown, key), shape) for _, key, shape in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _at(entry: dict[str, Any], key: str) -> Any:
    """``entry``'s value at a dotted key (``limit.measured.batch_reached``), or None."""
    for part in key.split("."):
        entry = entry.get(part) if isinstance(entry, dict) else None
    return entry


def _cell(value: Any, shape: str) -> str:
    if value is None:
        return ""
    if shape == ROUNDS:
        return " / ".join(f"{v:,.0f}" for v in value)
    return shape.format(value)


def markdown(summary: dict[str, Any]) -> str:
    s = summary["sample"]
    head = [
        f"# Tune: {summary['job']}",
        "",
        f"Sample: {s['rounds']} rounds of {s['per_round']} records "
        f"({'each on other records' if s.get('rounds_on_other_records') else 'the same records'}"
        f"; {s['share']:.1%} of the job's {s['job_records']}), runs of consecutive records "
        "in plan order. Each candidate is one engine start running every round (a fresh "
        "engine per round where the rounds share records); speed and cost are over "
        "generation (start-up left out), tokens/s the median round's, spread the rounds' "
        "range over it. Measurable: the round held at least twice the batch the engine "
        "reached (else the sample, not the setting, bound it: never chosen). Agreement: the "
        "share of the reference's answers a candidate gives the same (reference: KV cache in "
        "the model's dtype, no speculation), with its 95% Wilson interval; right to wrong "
        "and wrong to right: labelled records whose correctness moved against the reference. "
        "Bound by: what held the run back as the engine measured it (KV cache full or "
        "preempting, the batch at engine.max_num_seqs, steps at "
        "engine.max_num_batched_tokens, else the larger of prefill and decode time); "
        f"predicted bound: {_predicted_for(summary)}.",
        "",
        *table_lines(summary),
        "",
        *_compared_lines(summary),
        *[f"- {e['name']}: {e['not_measurable']}" for e in _unmeasurable(summary)],
        *chosen_lines(summary),
    ]
    return "\n".join(head) + "\n"


def _compared_lines(summary: dict[str, Any]) -> list[str]:
    why = summary["sample"].get("nothing_to_compare")
    if not why:
        return []
    return [
        f"Agreement: nothing to compare ({why}); only a setting that changes no answer "
        "(batch limits) or the reference can be chosen, on speed.",
        "",
    ]


def _unmeasurable(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in summary["candidates"] if e.get("not_measurable")]


def chosen_lines(summary: dict[str, Any]) -> list[str]:
    """The choice, why, its predicted gain, and the sample's cost against the job's."""
    chosen = summary.get("chosen")
    if not chosen:
        bar = summary["min_agreement"]
        return [f"No choice: the job did not run, or no candidate cleared {bar:.0%} agreement."]
    gain = chosen.get("speedup_over_job")
    told = (
        f"; predicted {gain:.2f}x the job's tokens/s" if gain and not chosen.get("is_job") else ""
    )
    lines = [
        f"Chosen: **{chosen['name']}** ({chosen['why']}{told}); sets {json.dumps(chosen['sets'])}."
    ]
    cost = summary["sample"].get("cost") or {}
    if cost:
        worst = max(cost["share_per_candidate"].values())
        aim = "within" if cost["within_aim"] else "over"
        lines.append(
            f"Sample cost: up to {worst:.1%} of the job's predicted generation time "
            f"({cost['job_generate_s_predicted']:,.1f} s) per candidate, "
            f"{cost['share_all_candidates']:.1%} for all; {aim} the {cost['aim']:.0%} aim."
        )
    if summary.get("check"):
        from nightshift.tuning.check import check_line

        lines.append(check_line(summary["check"]) + ".")
    return lines


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
    """tune.json, tune.md and tune.png, by name, into a folder ``claim_folder`` let the
    tune write in."""
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
        f"({json.dumps(chosen['sets'])}): {chosen.get('why', 'fastest that agrees')},",
        f"{entry['tokens_per_s']:,.0f} tokens/s (rounds spread {entry.get('spread') or 0:.1%})"
        + (f", predicted {gain:.2f}x the spec as it was" if gain else "")
        + f", agreement {entry['agreement']:.1%} with the reference answers"
        + (f" ({describe(entry['agreement_ci'])})." if entry.get("agreement_ci") else "."),
    ]
    text = "".join(f"# {line}\n" for line in comment) + yaml.safe_dump(tuned, sort_keys=False)
    path.write_text(text)


# What a tune writes in its folder, by name (DESIGN invariant 9: nothing else is touched).
TUNE_FILES = ("tune.json", "tune.md", "tune.png")
SLUG_MOST = 60  # characters of a candidate's name in its folder's name


def candidate_folders(candidates: list) -> list[str]:
    """Each candidate's folder name under ``runs/``: its name made safe, cut to
    ``SLUG_MOST`` characters with a digest of the whole name and setting where it had to
    change, so no two candidates share a folder."""
    import hashlib

    found: list[str] = []
    for c in candidates:
        safe = "".join(ch if ch.isalnum() or ch in "-_=" else "_" for ch in c.name)
        name = safe
        if safe != c.name or len(safe) > SLUG_MOST or safe in found:
            whole = json.dumps([c.name, c.sets], sort_keys=True, default=str)
            name = f"{safe[:SLUG_MOST]}-{hashlib.sha256(whole.encode()).hexdigest()[:10]}"
        found.append(name)
    return found


def claim_folder(folder: Path) -> None:
    """Refuse a --dir that holds files a tune did not write: a tune replaces its own
    files there (tune.*, sample/round-N.parquet, runs/, check/), so a folder of someone
    else's would lose them. An empty or new folder, or an earlier tune's, is taken."""
    from nightshift.errors import SpecError

    if not folder.exists():
        return
    if not folder.is_dir():
        raise SpecError("--dir", f"{folder} is a file", "name a folder (new or empty)")
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    foreign = [f for f in files if not _ours(f)] if _a_tune(folder) else files
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise SpecError(
            "--dir",
            f"{folder} holds files a tune did not write ({shown}); a tune writes only "
            "into a new or empty folder or an earlier tune's, and never replaces or "
            "deletes other files",
            "name a new or empty folder, or move those files elsewhere",
        )


def _a_tune(folder: Path) -> bool:
    """Whether ``folder``'s tune.json is one a tune wrote (checked inside)."""
    try:
        found = json.loads((folder / "tune.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and {"job", "sample", "candidates"} <= found.keys()


def _ours(name: str) -> bool:
    """A name an earlier tune writes: its own files, its samples (sample.parquet before
    rounds), its logs and its runs' outputs, where each job run replaces only its own
    keys by name (``io.outputs``), so another file there is never touched."""
    import re

    if name in TUNE_FILES or re.fullmatch(r"sample(/round-\d+)?\.parquet", name):
        return True
    return bool(re.fullmatch(r"(runs|check)/.+", name))
