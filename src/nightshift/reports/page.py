"""report.md and the headline table: the report.json figures, written for people.

The page is built from the report dict alone, so it can be rendered again from any
report.json later. Older reports lack some sections (timeline, shard_times, prefix_reuse,
this_run, shards, engine); each part of the page that needs one is left out without it.

Records and tokens describe the whole output (every committed shard, whichever run made
it); time, throughput and cost describe this invocation. The page says so where it
matters, because a resumed run's cost is not the whole job's cost.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from nightshift.reports.compare import compare_lines

# The formatters and Section live in reports.format; they are imported from here too.
from nightshift.reports.format import Section, count, duration, percent, rate, significant, usd
from nightshift.reports.quality import confusion_lines, quality_headline, quality_section
from nightshift.running.canary import summary_line

CHART_ALT = "Throughput over time and time per shard"


# What the report holds.


def run_tokens(report: dict[str, Any]) -> dict[str, int]:
    """The tokens this run generated, which cost and throughput are computed from.
    A report without ``this_run`` predates resuming, so its tokens were all this run's."""
    tokens = report.get("this_run", {}).get("tokens") or report["tokens"]
    return {
        "prompt": tokens["prompt"],
        "prompt_cached": tokens.get("prompt_cached", 0),
        "output": tokens["output"],
        "total": tokens["prompt"] + tokens["output"],
    }


def wall_hours(report: dict[str, Any]) -> float:
    return report["time_s"]["total"] / 3600


def has_chart(report: dict[str, Any]) -> bool:
    """A chart needs at least two timeline samples: rates come from their differences."""
    return len((report.get("timeline") or {}).get("samples") or []) >= 2


# Sections, shared by the page and the table artifact.


def records_section(report: dict[str, Any]) -> Section:
    r = report["records"]
    section = Section("Records", "Every input record in exactly one state, over the whole output.")
    section.add("input records", count(r["input"]), "records")
    section.add("ok", count(r["ok"]), "records")
    section.add("rejected", count(r["rejected"]), "records")
    section.add("failed", count(r["failed"]), "records")
    if "not_yet_run" in r:
        section.add("not yet run", count(r["not_yet_run"]), "records")
    shards, run = report.get("shards"), report.get("this_run")
    if shards:
        section.add("shards committed", count(shards["committed"]), f"of {count(shards['count'])}")
    if run:
        section.add("shards committed by this run", count(len(run["shards_committed"])), "shards")
    return section


def tokens_section(report: dict[str, Any]) -> Section:
    t = report["tokens"]
    section = Section("Tokens", "Over the whole output (all committed shards)." + _this_run(report))
    section.add("prompt tokens (in)", count(t["prompt"]), "tokens")
    section.add("cached prompt tokens", count(t["prompt_cached"]), "tokens")
    section.add("output tokens (out)", count(t["output"]), "tokens")
    if "reasoning" in t:  # model.reasoning: the thinking, of the output (priced as it)
        section.add("of which reasoning", count(t["reasoning"]), "tokens")
    section.add("total tokens", count(t["prompt"] + t["output"]), "tokens")
    section.add(
        "prefix-cache hit rate", percent(report["prefix_cache_hit_rate"]), "of prompt tokens"
    )
    reuse = report.get("prefix_reuse")
    if reuse:
        section.add("prefix reuse, measured", percent(reuse["measured"]), "of prompt tokens")
        section.add("prefix reuse, predicted", percent(reuse["predicted"]), "of prompt tokens")
        section.add(
            "prefix reuse, input order (predicted)",
            percent(reuse["input_order_predicted"]),
            "of prompt tokens",
        )
        if reuse.get("why_none"):  # a shared start shorter than one KV block
            section.note += f" Why the prefix cache served so little: {reuse['why_none']}."
    return section


def _this_run(report: dict[str, Any]) -> str:
    """Cost and throughput count this run's tokens; say what they were when a resumed
    run generated only part of the output."""
    mine, t = run_tokens(report), report["tokens"]
    if (mine["prompt"], mine["output"]) == (t["prompt"], t["output"]):
        return ""
    return (
        f" This run generated {count(mine['prompt'])} prompt and {count(mine['output'])} "
        "output tokens of them; cost and throughput below count those."
    )


def time_section(report: dict[str, Any]) -> Section:
    s = report["time_s"]
    parts = [("planning", s["plan"]), ("engine start-up", s["engine_startup"])]
    if s.get("prepare"):
        parts.insert(0, ("nightshift and Prefect start-up", s["prepare"]))
    if s.get("canary"):  # its own band, never generation (reports.assemble)
        parts.append(("the canary's sample runs", s["canary"]))
    parts.append(("generation", s["generate"]))
    shares = ", ".join(f"{name} {percent(_ratio(secs, s['total']))}" for name, secs in parts)
    overlap = s.get("startup_during_plan", 0.0)
    text = f"This run's wall time ({duration(s['total'])}); of it: {shares}."
    if overlap:
        text += (
            " The engine started while nightshift started up and built the plan: "
            f"{overlap:,.1f} s ran at once."
        )
    section = Section("Time", text)
    section.add("wall time", f"{s['total']:,.1f}", "s")
    for name, seconds in parts:
        section.add(name, f"{seconds:,.1f}", "s")
    if overlap:
        section.add("start-up during planning", f"{overlap:,.1f}", "s")
    for key, name in GENERATE_PARTS:  # generation as report.png's phases split it
        if key in s and (s[key] or key != "generate_canary"):  # a canary: its own band
            section.add(name, f"{s[key]:,.1f}", "s")
    return section


GENERATE_PARTS = [
    ("generate_canary", "of generation: the canary's sample runs"),
    ("generate_before_first_answer", "of generation: before the first answer"),
    ("generate_answering", "of generation: answering (first answer to last)"),
]


def throughput_section(report: dict[str, Any]) -> Section:
    t = report["throughput"]
    section = Section("Throughput", "For this run, over its generation time.")
    section.add("records per second", rate(t["records_per_s"]), "records/s")
    section.add("output tokens per second", rate(t["output_tokens_per_s"]), "tokens/s")
    section.add("total tokens per second", rate(t["total_tokens_per_s"]), "tokens/s")
    return section


def cost_section(report: dict[str, Any]) -> Section:
    c = report["cost"]
    per_m = c["usd_per_million_tokens"]
    note = (
        "For this run: its wall time, planning and engine start-up included (the GPUs are "
        "held all along), and the tokens it generated."
    )
    if c.get("note"):  # not priced, or priced as a GPU that did not run
        note = f"**{c['note'][0].upper()}{c['note'][1:]}.** " + note
    section = Section("Cost", note)
    section.add("GPU", str(c["gpu"]))
    section.add("GPUs", count(c["gpus"]), "GPUs")
    section.add("price per GPU-hour", usd(c["usd_per_gpu_hour"]), "USD/GPU-hour")
    section.add("GPU hours", significant(c["gpu_hours"]), "GPU-hours")
    section.add("total cost", usd(c["usd_total"]), "USD")
    section.add("cost per million input tokens", usd(per_m["input"]), "USD/1M tokens")
    section.add("cost per million output tokens", usd(per_m["output"]), "USD/1M tokens")
    section.add("cost per million tokens", usd(per_m["total"]), "USD/1M tokens")
    if "input_share" in c:
        section.add("input share of cost", percent(c["input_share"]), "of total cost")
    return section


def headline_sections(report: dict[str, Any]) -> list[Section]:
    sections = [
        records_section(report),
        tokens_section(report),
        time_section(report),
        throughput_section(report),
        cost_section(report),
    ]
    quality = quality_section(report)  # with eval: right after the cost it is set beside
    return sections + ([quality] if quality else [])


def report_table(report: dict[str, Any]) -> list[dict[str, str]]:
    """The headline figures as ``{"metric", "value", "unit"}`` rows (a Prefect table
    artifact), formatted exactly as on the page."""
    return [row for section in headline_sections(report) for row in section.rows]


# The page.


def report_markdown(report: dict[str, Any], chart_name: str | None = "report.png") -> str:
    """report.md: headline, Records, Tokens, Time, Throughput, Cost (with its formula
    worked out), Quality with eval (with the confusion matrix), the chart when
    ``chart_name`` is given and the report has a timeline, and a table of this run's
    shards."""
    lines = [f"# {report['job']}", "", headline(report), "", *stop_lines(report)]
    for section in headline_sections(report):
        lines += [f"## {section.title}", "", section.note, "", *markdown_table(section.rows)]
        if section.title == "Cost":
            lines += ["", *cost_formula_lines(report)]
            lines += cost_compare_lines(report)
        if section.title == "Quality":
            lines += ["", *confusion_lines(report)]
        lines.append("")
    lines += engine_lines(report)
    if report.get("canary"):  # the check of an answer-changing setting, as the summary says it
        lines += ["## Canary", "", summary_line(report["canary"]).removeprefix("canary: "), ""]
    if chart_name and has_chart(report):
        lines += ["## Over time", "", f"![{CHART_ALT}]({chart_name})", ""]
    lines += shard_lines(report)
    return "\n".join(lines).rstrip() + "\n"


def headline(report: dict[str, Any]) -> str:
    r = report["records"]
    text = (
        f"**{count(r['ok'])} ok, {count(r['rejected'])} rejected, {count(r['failed'])} failed** "
        f"of {count(r['input'])} input records"
    )
    if r.get("not_yet_run"):
        text += f" ({count(r['not_yet_run'])} not yet run)"
    shards = report.get("shards")
    if shards:
        text += f"; {count(shards['committed'])} of {count(shards['count'])} shards committed"
        if shards.get("failed"):
            text += f" (failed in this run: {', '.join(map(str, shards['failed']))})"
    return text + f". This run: {_run_cost(report)}.{quality_headline(report)}"


def _run_cost(report: dict[str, Any]) -> str:
    """Wall time and cost, the cost only as what it is (``reports.lines``)."""
    cost, wall = report["cost"], duration(report["time_s"]["total"])
    if cost.get("priced") is False:
        return f"{wall} wall time, not priced (cost.usd_per_gpu_hour is unset)"
    if cost.get("priced_hardware_ran") is False:
        return (
            f"{wall} wall time on {cost['ran_on']}; at the spec's price for "
            f"{count(cost['gpus'])}x {cost['gpu']} that time is {usd(cost['usd_total'])}, "
            f"not what the job costs on {cost['gpu']}"
        )
    return f"{wall} wall time, {usd(cost['usd_total'])} on {count(cost['gpus'])}x {cost['gpu']}"


def stop_lines(report: dict[str, Any]) -> list[str]:
    """What cut the run short: a stop (signal, cancellation) and engines found hung."""
    lines = []
    stopped = report.get("stopped")
    if stopped:
        lines.append(
            f"**Stopped** ({stopped.get('signal') or 'stop'}) "
            f"{duration(stopped.get('at_s') or 0)} into the run: every answer it held was "
            "checkpointed, requests in flight were not answers; rerun the same command "
            "to answer the rest."
        )
    stalls = (report.get("this_run") or {}).get("engine_stalls")
    if stalls:
        lines.append(
            f"The engine hung {count(stalls)} time(s) (no progress for run.stall_s): it was "
            "killed and its shards continued from their checkpoints on a fresh engine."
        )
    return [line for text in lines for line in (text, "")]


def cost_compare_lines(report: dict[str, Any]) -> list[str]:
    """The self-hosted cost beside providers' batch prices, when the report has them."""
    if not report.get("cost_compare"):
        return []
    intro = "The same tokens at providers' batch-tier prices (USD per million tokens):"
    return [
        "",
        "### Against provider batch prices",
        "",
        intro,
        "",
        *compare_lines(report["cost_compare"]),
    ]


def cost_formula_lines(report: dict[str, Any]) -> list[str]:
    """The cost formula in words, then with this report's numbers put in."""
    c = report["cost"]
    per_m = c["usd_per_million_tokens"]
    tokens = run_tokens(report)
    share = c.get("input_share", _ratio(tokens["prompt"], tokens["total"]))
    lines = [f"How: {c['formula']}.", ""] if c.get("formula") else []
    return lines + [
        "- usd_total = usd_per_gpu_hour x gpus x wall hours = "
        f"{usd(c['usd_per_gpu_hour'])} x {count(c['gpus'])} x {significant(wall_hours(report))} h"
        f" = {usd(c['usd_total'])}",
        f"- per million tokens = usd_total / tokens x 1e6 = {usd(c['usd_total'])} / "
        f"{count(tokens['total'])} x 1e6 = {usd(per_m['total'])}",
        f"- input = usd_total x input share / prompt tokens x 1e6 = {usd(c['usd_total'])} x "
        f"{percent(share)} / {count(tokens['prompt'])} x 1e6 = {usd(per_m['input'])}",
        f"- output = usd_total x (1 - input share) / output tokens x 1e6 = "
        f"{usd(c['usd_total'])} x {percent(1 - share)} / {count(tokens['output'])} x 1e6 = "
        f"{usd(per_m['output'])}",
    ]


def engine_lines(report: dict[str, Any]) -> list[str]:
    engine, run = report.get("engine") or {}, report.get("this_run") or {}
    if not engine:
        return []
    text = f"Engine: {engine.get('name', '?')}, KV cache {engine.get('kv_cache_dtype', '?')}"
    if engine.get("kv_cache_tokens"):
        text += f" ({count(engine['kv_cache_tokens'])} tokens)"
    if engine.get("block_size"):
        text += f", block size {engine['block_size']}"
    if "engine_starts" in run:
        text += f", started {run['engine_starts']} time(s) in this run"
    reasons = report.get("finish_reasons") or {}
    if reasons:
        text += "; finish reasons: " + ", ".join(f"{k} {count(v)}" for k, v in reasons.items())
    return [text + ".", ""]


def shard_lines(report: dict[str, Any]) -> list[str]:
    """This run's shards in start order, so the slow ones and the tail stand out."""
    shards = sorted(report.get("shard_times") or [], key=lambda s: s["started_s"])
    if not shards:
        return []
    started = _run_start(report)
    rows = [
        {
            "shard": str(s["shard"]),
            "records": count(s["records"]),
            "seconds": f"{s['seconds']:,.1f}",
            "records/s": rate(_ratio(s["records"], s["seconds"])),
            "started at": _clock(started, s["started_s"]),
        }
        for s in shards
    ]
    slowest = max(shards, key=lambda s: s["seconds"])
    note = (
        f"The {count(len(shards))} shard(s) this run committed, in start order; the slowest "
        f"was shard {slowest['shard']} ({slowest['seconds']:,.1f} s)." + _shard_time_note(report)
    )
    return ["## Shards", "", note, "", *markdown_table(rows), ""]


def _shard_time_note(report: dict[str, Any]) -> str:
    """Why the shards' seconds add up to less than the generation time."""
    s = report["time_s"]
    if "generate_answering" not in s:
        return ""
    return (
        " A shard's seconds run from its first answer to its commit, so together they "
        f"span the answering time ({s['generate_answering']:,.1f} s), not the whole "
        f"generation ({s['generate']:,.1f} s), which also counts the wait before the "
        f"first answer ({s.get('generate_before_first_answer', 0.0):,.1f} s)."
    )


def markdown_table(rows: list[dict[str, str]]) -> list[str]:
    """Rows as a markdown table; numbers right-aligned so their digits line up."""
    if not rows:
        return []
    columns = list(rows[0])
    rule = "".join(" ---: |" if c in _NUMBER_COLUMNS else " --- |" for c in columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + rule]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    return lines


_NUMBER_COLUMNS = {"value", "records", "seconds", "records/s"}


def _cell(text: str) -> str:
    # A pipe would end the cell early.
    return str(text).replace("|", "\\|")


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _run_start(report: dict[str, Any]) -> datetime | None:
    stamp = (report.get("timeline") or {}).get("started_at")
    try:
        return datetime.fromisoformat(stamp) if stamp else None
    except ValueError:
        return None


def _clock(started: datetime | None, offset_s: float) -> str:
    """Wall clock when the run's start is known, else seconds since the start."""
    since = f"+{offset_s:,.1f} s"
    if started is None:
        return since
    return f"{(started + timedelta(seconds=offset_s)).strftime('%H:%M:%S')} ({since})"
