"""report.json for one run: this run's figures and the whole output's counts, assembled
after the engines are closed, then written with report.md and report.png."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nightshift.evaluation.quality import report_quality
from nightshift.reports.compare import compare_section, engine_hardware
from nightshift.reports.files import write_report_files
from nightshift.reports.lines import cost_meaning
from nightshift.reports.phases import generate_parts
from nightshift.reports.reasoning import reasoning_section
from nightshift.reports.report import Timings, build_report, output_section, prefix_reuse_section
from nightshift.running.canary import canary_section
from nightshift.running.engines import EnginePool
from nightshift.running.placement import placement_section
from nightshift.running.runner import JobRun
from nightshift.running.workerstats import tail_seconds


@dataclass(frozen=True)
class RunOutcome:
    report: dict[str, Any]
    location: str


def finish_run(
    job: JobRun, engines: EnginePool, stopped: dict[str, Any] | None = None
) -> RunOutcome:
    """Write the report, after the engines are closed (they add their counters).
    ``stopped``: what stopped the run early (``report["stopped"]``), if anything did."""
    runner = job.runner
    job.progress.close(runner.totals)
    finished = job.progress.now()
    startup, overlap = engines.startup_s, 0.0  # workers' start-ups come as seconds only
    if engines.spans:
        startup, overlap = startup_seconds(engines.spans, job.progress.started, job.planned_s)
    job.progress.engines_started(engines.spans)  # the timeline's start-ups (report.png)
    # Generation ends with the last answer or commit; shutting the engine down and
    # writing the report after it is wrap-up, not generation.
    ended = job.progress.last_work if job.progress.last_work is not None else finished
    canary = canary_seconds(job.progress.canary, engines.spans, job.progress.started)
    times = Timings(
        total=finished,
        prepare=job.prepared_s,
        plan=job.planned_s - job.prepared_s,
        engine_startup=startup,
        # the canary's sample runs are a band of their own (time_s.canary), never
        # generation: its tokens/s would count two sample runs and a reference's start
        generate=max(0.0, ended - job.planned_s - startup + overlap - canary),
        overlap=overlap,
        wrap_up=finished - ended,
    )
    report = _report(job, engines, times, stopped, canary)
    return RunOutcome(report, job.output.location)


def canary_seconds(
    span: dict[str, float] | None, startups: list[tuple[float, float]], clock_start: float
) -> float:
    """The canary's seconds on the run's clock (``span``: its ``began_s``/``ended_s``)
    less the job's engine start-up inside it, which ``time_s.engine_startup`` counts."""
    if not span:
        return 0.0
    began, ended = span["began_s"], span["ended_s"]
    inside = sum(
        max(0.0, min(ended, e - clock_start) - max(began, b - clock_start)) for b, e in startups
    )
    return max(0.0, ended - began - inside)


def startup_seconds(
    spans: list[tuple[float, float]], clock_start: float, planned_s: float
) -> tuple[float, float]:
    """Engine start-up seconds within this run's clock, and how many of them ran while
    the plan was being built (from ``clock_start`` to ``planned_s`` after it)."""
    clipped = [(max(b, clock_start), max(e, clock_start)) for b, e in spans]
    plan_end = clock_start + planned_s
    startup = sum(e - b for b, e in clipped)
    overlap = sum(max(0.0, min(e, plan_end) - b) for b, e in clipped)
    return startup, overlap


def _report(
    job: JobRun,
    engines: EnginePool,
    times: Timings,
    stopped: dict[str, Any] | None,
    canary_s: float = 0.0,
) -> dict[str, Any]:
    """This run's figures, the whole output's counts from the commit markers, written
    after the stale files of dead or losing attempts are deleted."""
    spec, output, runner, manifest = job.spec, job.output, job.runner, job.manifest
    markers = output.shards.committed()
    report = build_report(spec.name, runner.totals, times, engines.stats, engines.info, spec.cost)
    report["time_s"]["canary"] = round(canary_s, 3)  # its own band: not in generate
    report.update(output_section(manifest, markers, runner.failures))
    report["this_run"] = {
        "attempt": runner.attempt,
        "shards_committed": sorted(runner.committed),
        "records_answered": runner.totals.ok + runner.totals.failed,
        "tokens": {
            "prompt": runner.totals.prompt_tokens,
            "prompt_cached": runner.totals.prompt_tokens_cached,
            "output": runner.totals.output_tokens,
        },
        "engine_starts": engines.starts,
        # Engines killed as hung (run.stall_s); their shards went on on a fresh engine.
        "engine_stalls": runner.engine_stalls,
    }
    report["placement"] = placement_section(engines.placements)  # which GPUs ran what
    if stopped is not None:  # stopped early (a signal, a cancellation): rerun to finish
        report["stopped"] = stopped
    report["prefix_reuse"] = prefix_reuse_section(manifest["prefix_reuse"], report["tokens"])
    # dedup: records answered from another record's answer, and the tokens they did not send
    report["repeats"] = {
        **manifest.get("repeats", {"copies": 0, "prompt_tokens_not_sent": 0}),
        "this_run": {
            k: runner.saved[k]
            for k in ("rows", "prompt_tokens_not_sent", "output_tokens_not_generated")
        },
    }
    if runner.cache is not None:  # cache.path: answers found there, and stored
        report["response_cache"] = runner.cache.section()
    c = report["cost"]  # beside the providers' batch prices (reports.compare)
    ran_on = engine_hardware(engines.info.name if engines.info else None, _devices(engines))
    report["cost_compare"] = compare_section(
        spec.cost, c["usd_total"], c["input_share"], report["this_run"]["tokens"], ran_on
    )
    c.update(cost_meaning(spec.cost, ran_on))  # whether the figure is a cost at all
    dimension = getattr(runner.task, "dimension", None)
    if dimension:  # embed: every vector's size, and whether it is of length 1
        normalized = spec.embed.normalize if spec.embed else True
        report["embedding"] = {"dimension": dimension, "normalized": normalized}
    reasoning = reasoning_section(spec, markers, runner.totals)
    if reasoning is not None:  # model.reasoning: the thinking tokens, apart from answers
        report["reasoning"] = reasoning
    calibration = runner.calibration.section()
    if calibration is not None:  # classify: what the labels were corrected by
        report["calibration"] = calibration
    canary = canary_section(spec, output.plans.canary(), runner.canary_answers)
    if canary is not None:  # run.canary: the job's settings against the reference
        report["canary"] = canary
    # eval: quality over every committed record, beside this run's cost
    quality = report_quality(spec, output, c["usd_total"])
    if quality is not None:
        report["quality"] = quality
    report["plan"] = {"path": output.store.uri("plan"), "fingerprint": manifest["fingerprint"]}
    report["timeline"] = job.progress.timeline()
    report["time_s"].update(generate_parts(report))  # what generation's seconds held
    report["shard_times"] = job.progress.shard_table()
    tail = job.progress.tail_s()
    report["tail_s"] = tail if tail is not None else tail_seconds(report["timeline"]["samples"])
    # The settings that produced these rows travel with them (temperature 0 is not enough
    # to reproduce a run: batch composition changes results too).
    report["spec"] = spec.model_dump(mode="json", by_alias=True)
    report["output"] = output.location
    output.shards.delete_unnamed(runner.attempt)  # after this run's last commit
    write_report_files(output, report)
    return report


def _devices(engines: Any) -> int:
    """How many GPUs one engine of this run held (placement), 0 on a CPU host."""
    for entry in engines.placements:
        visible = entry.get("cuda_visible_devices")
        if visible:
            return len(visible.split(","))
    return 0
