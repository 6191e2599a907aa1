"""What each stretch of a run's wall time was spent on, on the run's clock.

report.png draws these as bands behind its curves, so no part of a run is an unexplained
gap, and the summary splits generation the same way:

* **nightshift and Prefect start-up**: their own start before planning (``time_s.prepare``);
* **planning** (``time_s.plan``);
* **engine start-up**: the union of every engine's start (``timeline.engine_startups``);
* **canary**: its two sample runs, only when it ran them (``canary.runs``): a canary
  with nothing to compare (an FP8 KV cache this CPU cannot hold) runs none;
* **waiting for the first answer**: the engine works, but no request has finished yet
  (every request of a batch runs at once, so the first answers come late and together);
* **generating**: from the first answer to the last answer or commit;
* **wrap-up**: engine shutdown and the report.

A report from before a phase was recorded is drawn without it.
"""

from __future__ import annotations

from typing import Any

MIN_S = 0.05  # shorter than this is not a band anyone could see


def run_phases(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The bands, ``{"label", "start_s", "end_s"}``, in the order they begin."""
    times, timeline = report.get("time_s") or {}, report.get("timeline") or {}
    bands = []
    prepare, plan_s = times.get("prepare", 0.0), times.get("plan", 0.0)
    _add(bands, "nightshift and Prefect start-up", 0.0, prepare)
    _add(bands, "planning", prepare, prepare + plan_s)
    for begin, end in startup_union(timeline.get("engine_startups") or []):
        _add(bands, "engine start-up", begin, end)
    canary = canary_span(report)
    if canary:
        _add(bands, "canary", *canary)
    first, last = timeline.get("first_answer_s"), timeline.get("last_answer_s")
    if first is not None:
        before = max((b["end_s"] for b in bands if b["start_s"] < first), default=0.0)
        _add(bands, "waiting for the first answer", min(before, first), first)
        _add(bands, "generating", first, last if last is not None else first)
        _add(bands, "wrap-up", last if last is not None else first, times.get("total", 0.0))
    return bands


def _add(bands: list[dict[str, Any]], label: str, start: float, end: float) -> None:
    if end - start >= MIN_S:
        bands.append({"label": label, "start_s": start, "end_s": end})


def canary_span(report: dict[str, Any]) -> tuple[float, float] | None:
    """When the canary's sample runs ran; None when it ran none (nothing to compare, or
    its figure was kept from an earlier run)."""
    span = (report.get("timeline") or {}).get("canary")
    section = report.get("canary")
    ran = section is None or bool(section.get("runs"))  # no section: an older report
    if not span or not ran or span["ended_s"] <= span["began_s"]:
        return None
    return span["began_s"], span["ended_s"]


def startup_union(spans: list[dict[str, float]]) -> list[tuple[float, float]]:
    """Engine start-ups merged where they overlap, in time order.

    The union, not one band per engine: a scaled-out run's workers start their engines
    within moments of each other, and translucent bands stacked per engine would read as
    shades that mean something. What the band answers is "was an engine still starting
    here", which the union says plainly; a restart after a crash, later in the run, still
    shows as a band of its own.
    """
    merged: list[tuple[float, float]] = []
    for span in sorted(spans, key=lambda s: s["began_s"]):
        begin, end = span["began_s"], span["ready_s"]
        if end <= begin:
            continue
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged


def generate_parts(report: dict[str, Any]) -> dict[str, float]:
    """``time_s.generate`` split (``time_s.generate_*``): the canary's sample runs, the
    wait before the first answer, and answering (first answer to the last); empty for a
    run that answered nothing here. Shard times span only the answering part."""
    times, timeline = report["time_s"], report.get("timeline") or {}
    first = timeline.get("first_answer_s")
    if first is None:
        return {}
    end = times["total"] - times.get("wrap_up", 0.0)
    begin = end - times["generate"]
    canary = canary_span(report)
    canary_s = max(0.0, min(canary[1], end) - max(canary[0], begin)) if canary else 0.0
    waited_from = max(begin, canary[1]) if canary else begin
    return {
        "generate_canary": round(canary_s, 3),
        "generate_before_first_answer": round(max(0.0, first - waited_from), 3),
        "generate_answering": round(max(0.0, end - first), 3),
    }
