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
from nightshift.jobs.plan import build_plan, describe
from nightshift.jobs.report import Timings, build_report, output_section, prefix_reuse_section
from nightshift.jobs.shards import ShardRunner
from nightshift.jobs.spec import JobSpec


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


def run_job(
    spec: JobSpec,
    *,
    overwrite: bool = False,
    new_run: bool = False,
    engine: Engine | None = None,
    progress: bool = True,
) -> RunOutcome:
    """Run ``spec``, resuming a run of the same spec in its output. Pass ``engine`` to use
    a running engine (its start-up is not billed); engines built here are rebuilt after
    a crash."""
    started = time.perf_counter()
    output = JobOutput(new_run_location(spec.output.path) if new_run else spec.output.path)
    if engine is None:
        check_engine_spec(spec)
    stamp = plan_stamp(spec)  # hashes the model's files: once per run
    manifest = _resumable_plan(output, stamp, overwrite)
    encoder = load_encoder(spec)
    if manifest is None:
        plan = build_plan(spec, encoder, progress)
        output.plans.write(plan, {**describe(plan, spec), **stamp})  # before generation
        manifest = output.plans.manifest()
    planned = time.perf_counter()
    committed = output.shards.committed()
    todo = [s for s in range(manifest["shards"]["count"]) if s not in committed]
    runner = ShardRunner(spec, output.plans, output.shards, manifest, encoder)
    engines = EnginePool(spec, engine)
    runner.run(todo, engines, progress)
    finished = time.perf_counter()
    times = Timings(
        total=finished - started,
        plan=planned - started,
        engine_startup=engines.startup_s,
        generate=finished - planned - engines.startup_s,
    )
    report = _report(spec, output, manifest, runner, engines, times)
    if runner.failures:
        names = ", ".join(f"shard {s} ({e})" for s, e in sorted(runner.failures.items()))
        raise ShardsFailedError(
            f"{len(runner.failures)} shard(s) still failed after {spec.run.shard_attempts} "
            f"attempts: {names}; rerun the same command to retry them"
        )
    return RunOutcome(report, output.location)


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


def _report(
    spec: JobSpec,
    output: JobOutput,
    manifest: dict[str, Any],
    runner: ShardRunner,
    engines: EnginePool,
    times: Timings,
) -> dict[str, Any]:
    """This run's figures, the whole output's counts from the commit markers, written
    after the stale files of dead or losing attempts are deleted."""
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
    # The settings that produced these rows travel with them (temperature 0 is not enough
    # to reproduce a run: batch composition changes results too).
    report["spec"] = spec.model_dump(mode="json", by_alias=True)
    output.shards.delete_unnamed(markers)
    report["report"] = output.write_report(report)
    return report


@dataclass
class EnginePool:
    """Engines for one run: the caller's, or ones built from the spec, a fresh one after
    each crash. Adds up start-up time and the engines' own counters."""

    spec: JobSpec
    given: Engine | None
    startup_s: float = 0.0
    starts: int = 0
    stats: EngineStats = field(default_factory=EngineStats)
    info: EngineInfo | None = None
    _before: EngineStats = field(default_factory=EngineStats)

    def acquire(self) -> Engine:
        if self.given is not None:
            self._before = self.given.stats()
            return self.given
        began = time.perf_counter()
        engine = build_engine(self.spec)
        self.startup_s += time.perf_counter() - began
        self.starts += 1
        self._before = EngineStats()
        return engine

    def release(self, engine: Engine) -> None:
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
