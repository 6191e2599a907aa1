"""Run one job end to end: plan, start the engine, stream records through it, commit, report.

The runner owns the order of things and the clock; every step it calls lives in its
own module (plan, engines, results, io.outputs, report). Records reach the engine in
the plan's order, shard after shard, read from the plan's shard files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from nightshift.engines import build_engine, check_engine_spec
from nightshift.engines.base import Engine, EngineStats, Sampling
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import JobAbortedError
from nightshift.io.outputs import OutputDir
from nightshift.io.planstore import PlanStore
from nightshift.jobs.feed import RequestFeed
from nightshift.jobs.plan import Plan, build_plan, describe
from nightshift.jobs.report import RunTotals, Timings, build_report, prefix_reuse_section
from nightshift.jobs.results import ResultTables
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import TaskHandler, answer_budget, handler_for

FAIL_FAST_RECORDS = 50


@dataclass(frozen=True)
class RunOutcome:
    report: dict[str, Any]
    output: OutputDir


def load_encoder(spec: JobSpec) -> PromptEncoder:
    key = "model.tokenizer" if spec.model.tokenizer else "model.path"
    source = spec.model.tokenizer or spec.model.path
    return PromptEncoder.load(source, spec.model.trust_remote_code, key)


def sampling_for(spec: JobSpec, task: TaskHandler) -> Sampling:
    s = spec.sampling
    budget = answer_budget(spec)
    return Sampling(budget, s.temperature, s.top_p, s.seed, tuple(s.stop), task.constraint)


def run_job(
    spec: JobSpec, *, overwrite: bool = False, engine: Engine | None = None, progress: bool = True
) -> RunOutcome:
    """Run ``spec``. Pass ``engine`` to reuse a running engine (its start-up is not billed)."""
    started = time.perf_counter()
    output = OutputDir(spec.output.path)
    output.check_free(overwrite)  # refuse before any work, but delete nothing yet
    if engine is None:
        check_engine_spec(spec)
    encoder = load_encoder(spec)
    plan = build_plan(spec, encoder, progress)
    store = PlanStore(output.root)
    store.write(plan, describe(plan, spec))  # before generation: the run follows it
    planned = time.perf_counter()
    owned = engine is None and plan.records.height > 0  # nothing to run: no engine to start
    if owned:
        engine = build_engine(spec)
    engine_ready = time.perf_counter()
    try:
        output.start()
        before = engine.stats() if engine else EngineStats()
        totals = _generate(spec, plan, RequestFeed(spec, store, encoder), engine, output, progress)
        stats = _delta(engine.stats(), before) if engine else EngineStats()
    finally:
        if owned:
            engine.close()
    generated = time.perf_counter()
    times = Timings(
        total=generated - started,
        plan=planned - started,
        engine_startup=engine_ready - planned,
        generate=generated - engine_ready,
    )
    info = engine.info if engine else None
    report = build_report(spec.name, totals, times, stats, info, spec.cost)
    report["prefix_reuse"] = prefix_reuse_section(plan.prefix_reuse, totals)
    report["plan"] = {"path": str(store.root), "shards": plan.shard_count}
    # The settings that produced these rows travel with them (temperature 0 is not enough
    # to reproduce a run: batch composition changes results too).
    report["spec"] = spec.model_dump(mode="json", by_alias=True)
    output.commit(report)
    return RunOutcome(report, output)


def _generate(
    spec: JobSpec,
    plan: Plan,
    feed: RequestFeed,
    engine: Engine | None,
    output: OutputDir,
    progress: bool,
) -> RunTotals:
    """Stream the plan through the engine; write a results part every ``chunk_records``."""
    task = handler_for(spec.task)
    tables = ResultTables(plan.input_schema, spec.input.id_column, spec.input.keep_columns, task)
    totals = RunTotals(input_records=plan.input_records, rejected=plan.rejects.height)
    ok, failed, parts = [], [], 0
    bar = tqdm(total=plan.records.height, desc="generate", unit="rec", disable=not progress)
    runnable = engine is not None and plan.records.height > 0
    results = (
        engine.run(feed.requests(plan.shard_count), sampling_for(spec, task))
        if runnable
        else iter(())
    )
    for result in results:
        row, is_ok = tables.row(*feed.answered(result.key), result)
        (ok if is_ok else failed).append(row)
        totals.count(row, is_ok)
        _stop_if_everything_fails(totals, failed)
        if len(ok) >= spec.run.chunk_records:
            output.write_part(parts, tables.results_table(ok))
            ok, parts = [], parts + 1
        bar.update(1)
        if progress and bar.n % 256 == 0:
            _show_speed(bar, totals)
    if ok or parts == 0:
        output.write_part(parts, tables.results_table(ok))
    bar.close()
    output.write_rejects(tables.rejects_table(feed.store.rejects()))
    output.write_failed(tables.failed_table(failed))
    return totals


def _stop_if_everything_fails(totals: RunTotals, failed: list[dict]) -> None:
    """The first records all failing alike means the job is wrong, not the records
    (for example a JSON schema the engine cannot compile): stop before spending the rest."""
    if totals.ok or totals.failed != FAIL_FAST_RECORDS:
        return
    errors = {row["error"] for row in failed}
    if len(errors) == 1:
        raise JobAbortedError(
            f"the first {FAIL_FAST_RECORDS} records all failed with: {errors.pop()}; "
            "stopped so the rest of the job is not spent the same way"
        )


def _show_speed(bar: tqdm, totals: RunTotals) -> None:
    elapsed = max(bar.format_dict["elapsed"], 1e-9)
    bar.set_postfix(tok_s=f"{totals.all_tokens / elapsed:,.0f}", refresh=False)


def _delta(after: EngineStats, before: EngineStats) -> EngineStats:
    return EngineStats(**{k: v - getattr(before, k) for k, v in vars(after).items()})
