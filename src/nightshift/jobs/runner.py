"""Run one job end to end: plan (or resume), run the shards left, report.

The runner owns the order of things and the clock; every step it calls lives in its
own module (plan, shards, engines, io.outputs, report). A rerun of the same spec into
the same output resumes: the plan written by the first run is reused without reading
the input again, committed shards are skipped, and a partly done shard continues after
its last checkpoint. A rerun of a different spec is refused (see ``jobs.fingerprint``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from nightshift.engines import build_engine, check_engine_spec
from nightshift.engines.base import Engine, EngineInfo, EngineStats
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import NightshiftError, OutputExistsError
from nightshift.io.outputs import JobOutput, new_run_location
from nightshift.jobs.fingerprint import changed_keys, plan_stamp
from nightshift.jobs.increments import add_new_records
from nightshift.jobs.plan import build_plan, describe
from nightshift.jobs.progress import LiveProgress
from nightshift.jobs.report import Timings, build_report, output_section, prefix_reuse_section
from nightshift.jobs.shards import ShardRunner
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.workerstats import tail_seconds


class ShardsFailedError(NightshiftError):
    """Some shards are still failed after all their attempts; rerun to retry them."""


@dataclass(frozen=True)
class RunOutcome:
    report: dict[str, Any]
    location: str


def load_encoder(spec: JobSpec) -> PromptEncoder:
    key = "model.tokenizer" if spec.model.tokenizer else "model.path"
    source = spec.model.tokenizer or spec.model.path
    return PromptEncoder.load(source, spec.model.trust_remote_code, key)


@dataclass
class JobRun:
    """One invocation of a job on one output, between planning and the report: what the
    steps (``start_run``, the shard runner, ``finish_run``) hand each other. The CLI's
    Prefect flow (``pipelines.flow``) calls the same steps as tasks."""

    spec: JobSpec
    output: JobOutput
    manifest: dict[str, Any]
    runner: ShardRunner
    todo: list[int]
    progress: LiveProgress
    planned_s: float


def start_run(
    spec: JobSpec,
    *,
    overwrite: bool = False,
    new_run: bool = False,
    progress: bool = True,
    retry_in_place: bool = True,
    as_worker: bool = False,
) -> JobRun:
    """Plan the job, or take up the plan of an earlier run of it (adding an increment
    for records new since, see ``jobs.increments``); list the shards left to run.
    ``as_worker``: one of several workers; it takes up the plan as it is (the
    coordinator planned it) and never plans."""
    clock = LiveProgress(spec.cost, show=progress)
    output = JobOutput(new_run_location(spec.output.path) if new_run else spec.output.path)
    stamp = plan_stamp(spec)  # hashes the model's files: once per run
    manifest = _resumable_plan(output, stamp, overwrite)
    if as_worker and manifest is None:
        raise OutputExistsError(
            f"output.path: {output.location} has no plan for a worker to take up; "
            "run `nightshift jobs plan SPEC --write` (or `jobs run`) first"
        )
    encoder = load_encoder(spec)
    if manifest is None:
        plan = build_plan(spec, encoder, progress)
        output.plans.write(plan, {**describe(plan, spec), **stamp})  # before generation
        manifest = output.plans.manifest()
    elif spec.run.incremental and not as_worker:
        manifest = add_new_records(spec, output.plans, manifest, encoder, progress)
    committed = output.shards.committed()
    todo = [s["index"] for s in manifest["shards"]["each"] if s["index"] not in committed]
    runner = ShardRunner(
        spec, output.plans, output.shards, manifest, encoder, clock, retry_in_place
    )
    clock.expect(runner.records_left(todo))
    return JobRun(spec, output, manifest, runner, todo, clock, clock.now())


def finish_run(job: JobRun, engines: EnginePool) -> RunOutcome:
    """Write the report, after the engines are closed (they add their counters)."""
    runner = job.runner
    job.progress.close(runner.totals)
    finished = job.progress.now()
    times = Timings(
        total=finished,
        plan=job.planned_s,
        engine_startup=engines.startup_s,
        generate=finished - job.planned_s - engines.startup_s,
    )
    return RunOutcome(_report(job, engines, times), job.output.location)


def raise_if_failed(job: JobRun) -> None:
    """Raise ``ShardsFailedError`` naming the shards still failed after all attempts."""
    failures = job.runner.failures
    if failures:
        names = ", ".join(f"shard {s} ({e})" for s, e in sorted(failures.items()))
        raise ShardsFailedError(
            f"{len(failures)} shard(s) still failed after {job.spec.run.shard_attempts} "
            f"attempts: {names}; rerun the same command to retry them"
        )


def run_job(
    spec: JobSpec,
    *,
    overwrite: bool = False,
    new_run: bool = False,
    engine: Engine | None = None,
    progress: bool = True,
) -> RunOutcome:
    """Run ``spec`` in this process, without Prefect, resuming a run of the same spec in
    its output. Pass ``engine`` to use a running engine (its start-up is not billed);
    engines built here are rebuilt after a crash."""
    if engine is None:
        check_engine_spec(spec)
    job = start_run(spec, overwrite=overwrite, new_run=new_run, progress=progress)
    engines = EnginePool(spec, engine)
    try:
        job.runner.run(job.todo, engines)
    finally:
        engines.close()
    outcome = finish_run(job, engines)
    raise_if_failed(job)
    return outcome


def _resumable_plan(
    output: JobOutput, stamp: dict[str, Any], overwrite: bool
) -> dict[str, Any] | None:
    """The plan of an earlier run of the same job here, to resume; None to plan afresh.
    Refuses an output that holds a different job's run."""
    if overwrite:
        output.clear()
        return None
    manifest = output.plans.manifest()
    if manifest is None:
        if output.holds_a_run():
            raise OutputExistsError(
                f"output.path: {output.location} holds a run nightshift cannot resume (no "
                "plan.json); pass --overwrite to replace it or --new-run to start beside it"
            )
        return None
    if manifest.get("fingerprint") != stamp["fingerprint"]:
        changed = changed_keys(manifest.get("fingerprint_inputs", {}), stamp["fingerprint_inputs"])
        raise OutputExistsError(
            f"output.path: {output.location} holds a run of a different job "
            f"({', '.join(changed)} changed); run the spec it was made with to resume it, "
            "pass --new-run to start a fresh run beside it, or --overwrite to replace it"
        )
    return manifest


def _report(job: JobRun, engines: EnginePool, times: Timings) -> dict[str, Any]:
    """This run's figures, the whole output's counts from the commit markers, written
    after the stale files of dead or losing attempts are deleted."""
    spec, output, runner, manifest = job.spec, job.output, job.runner, job.manifest
    markers = output.shards.committed()
    report = build_report(spec.name, runner.totals, times, engines.stats, engines.info, spec.cost)
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
    }
    report["prefix_reuse"] = prefix_reuse_section(manifest["prefix_reuse"], report["tokens"])
    report["plan"] = {"path": output.store.uri("plan"), "fingerprint": manifest["fingerprint"]}
    report["timeline"] = job.progress.timeline()
    report["shard_times"] = job.progress.shard_table()
    tail = job.progress.tail_s()
    report["tail_s"] = tail if tail is not None else tail_seconds(report["timeline"]["samples"])
    # The settings that produced these rows travel with them (temperature 0 is not enough
    # to reproduce a run: batch composition changes results too).
    report["spec"] = spec.model_dump(mode="json", by_alias=True)
    report["output"] = output.location
    output.shards.delete_unnamed(markers)
    output.write_report_files(report)
    return report


@dataclass
class EnginePool:
    """The run's engine: the caller's, or one built from the spec on first use (a run
    with nothing left to generate starts none), kept warm across shards, and built
    afresh after a crash. Adds up start-up time and the engines' own counters."""

    spec: JobSpec
    given: Engine | None = None
    startup_s: float = 0.0
    starts: int = 0
    stats: EngineStats = field(default_factory=EngineStats)
    info: EngineInfo | None = None
    _engine: Engine | None = None
    _before: EngineStats = field(default_factory=EngineStats)

    def acquire(self) -> Engine:
        if self._engine is not None:
            return self._engine
        if self.given is not None:
            self._before, self._engine = self.given.stats(), self.given
            return self.given
        began = time.perf_counter()
        self._engine = build_engine(self.spec)
        self.startup_s += time.perf_counter() - began
        self.starts += 1
        self._before = EngineStats()
        return self._engine

    def discard(self, engine: Engine) -> None:
        self.close()

    def close(self) -> None:
        """Count the engine's work and shut it down (the caller's engine stays up)."""
        engine, self._engine = self._engine, None
        if engine is None:
            return
        self.info = engine.info
        # A dead engine may not answer at all; the results' own counts remain.
        with contextlib.suppress(Exception):
            self.stats = _add(self.stats, _delta(engine.stats(), self._before))
        if engine is not self.given:
            engine.close()


def _delta(after: EngineStats, before: EngineStats) -> EngineStats:
    return EngineStats(**{k: v - getattr(before, k) for k, v in vars(after).items()})


def _add(a: EngineStats, b: EngineStats) -> EngineStats:
    return EngineStats(**{k: v + getattr(b, k) for k, v in vars(a).items()})
