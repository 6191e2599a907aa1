"""The run summary's time and cost lines, each saying what its figures hold.

Time: generation is split as report.png draws it (``reports.phases``): a canary's sample
runs and the wait for the first answer are part of it, while a shard's time runs from
its first answer, so the split says why the shard table adds up to less.

Cost: a figure is only as true as its price. Without ``cost.usd_per_gpu_hour`` there is
no cost to state, so none is stated (not "$0"). With a price for a GPU that did not run
(a CPU run priced as an h100), the total is the spec's price applied to this run's time,
and it says so; per-token figures are left out, since the tokens/s of another machine
say nothing about that GPU (``jobs plan --gpu`` predicts them). Only a run on the GPU
it is priced as gets the per-token figures.
"""

from __future__ import annotations

from typing import Any

from nightshift.jobs.spec import CostSpec
from nightshift.reports.compare import hardware_note


def cost_meaning(cost: CostSpec, ran_on: str) -> dict[str, Any]:
    """report.json's ``cost.priced``, ``cost.ran_on``, ``cost.priced_hardware_ran`` and
    ``cost.note`` (None for a cost that means what it says)."""
    priced = cost.usd_per_gpu_hour > 0
    matches = hardware_note(cost, ran_on) is None
    note = None
    if not priced:
        note = f"not priced: cost.usd_per_gpu_hour is unset (the price of one {cost.gpu} hour)"
    elif not matches:
        note = (
            f"the spec's price for {cost.gpus}x {cost.gpu} applied to this run's time on "
            f"{ran_on}: not what the job costs on {cost.gpu}, and no per-token cost "
            f"(`jobs plan --gpu {cost.gpu}` predicts one)"
        )
    return {"priced": priced, "ran_on": ran_on, "priced_hardware_ran": matches, "note": note}


def cost_line(report: dict[str, Any]) -> str:
    c = report["cost"]
    per_m = c["usd_per_million_tokens"]
    if c.get("priced") is False:
        return f"cost: {c['note']}"
    if c.get("priced_hardware_ran") is False:
        return (
            f"cost: ${c['usd_total']:.4f} = {c['gpus']}x {c['gpu']} at "
            f"${c['usd_per_gpu_hour']:g}/GPU-hour for this run's "
            f"{report['time_s']['total']:.1f}s; it ran on {c['ran_on']}, so this is not "
            f"what the job costs on {c['gpu']} (`jobs plan --gpu {c['gpu']}` predicts that)"
        )
    return (
        f"cost: ${c['usd_total']:.4f} on {c['gpus']}x {c['gpu']}; per 1M tokens: "
        f"${per_m['input']:.4f} in, ${per_m['output']:.4f} out, ${per_m['total']:.4f} overall"
    )


def time_line(report: dict[str, Any]) -> str:
    s = report["time_s"]
    prepare = s.get("prepare", 0.0)
    parts = [f"{prepare:.1f}s start-up"] if prepare >= 0.05 else []
    parts += [f"{s['plan']:.1f}s plan", f"{s['engine_startup']:.1f}s engine start"]
    if s.get("canary", 0.0) >= 0.05:  # a report that keeps the canary out of generate
        parts.append(f"{s['canary']:.1f}s canary")
    parts.append(f"{s['generate']:.1f}s generate{_generate_split(s)}")
    return (
        f"time: {s['total']:.1f}s total ({', '.join(parts)}); "
        f"{report['throughput']['total_tokens_per_s']:,.0f} tokens/s"
    )


def _generate_split(s: dict[str, float]) -> str:
    """``: 12.0s canary, 85.0s before the first answer, 36.0s answering``, or nothing
    for a report without the split (or with nothing but answering in it)."""
    if "generate_answering" not in s:
        return ""
    split = [
        (s.get("generate_canary", 0.0), "canary"),
        (s.get("generate_before_first_answer", 0.0), "before the first answer"),
    ]
    shown = [f"{seconds:.1f}s {name}" for seconds, name in split if seconds >= 0.05]
    if not shown:
        return ""
    return ": " + ", ".join([*shown, f"{s['generate_answering']:.1f}s answering"])
