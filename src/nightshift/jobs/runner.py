"""Run one job end to end: plan, start the engine, stream records through it, commit, report.

The runner owns the order of things and the clock; every step it calls lives in its
own module (plan, engines, results, io.outputs, report).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from nightshift.engines import build_engine, check_engine_spec
from nightshift.engines.base import Engine, EngineRequest, EngineStats, Sampling
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import JobAbortedError
from nightshift.io.outputs import OutputDir
from nightshift.jobs.plan import Plan, build_plan
from nightshift.jobs.report import RunTotals, Timings, build_report
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
    plan = build_plan(spec, load_encoder(spec), progress)
    planned = time.perf_counter()
    owned = engine is None and bool(plan.records)  # nothing to run: no engine to start
    if owned:
        engine = build_engine(spec)
    engine_ready = time.perf_counter()
    try:
        output.start()
        before = engine.stats() if engine else EngineStats()
        totals = _generate(spec, plan, engine, output, progress)
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
    # The settings that produced these rows travel with them (temperature 0 is not enough
    # to reproduce a run: batch composition changes results too).
    report["spec"] = spec.model_dump(mode="json", by_alias=True)
    output.commit(report)
    return RunOutcome(report, output)


def _generate(
    spec: JobSpec, plan: Plan, engine: Engine | None, output: OutputDir, progress: bool
) -> RunTotals:
    """Stream the plan through the engine; write a results part every ``chunk_records``."""
    task = handler_for(spec.task)
    tables = ResultTables(plan.input_schema, spec.input.id_column, spec.input.keep_columns, task)
    totals = RunTotals(input_records=plan.input_records, rejected=len(plan.rejects))
    ok, failed, parts = [], [], 0
    bar = tqdm(total=len(plan.records), desc="generate", unit="rec", disable=not progress)
    requests = (EngineRequest(r.key, r.token_ids) for r in plan.records)
    results = engine.run(requests, sampling_for(spec, task)) if plan.records else iter(())
    for result in results:
        row, is_ok = tables.row(plan.records[result.key], result)
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
    output.write_rejects(tables.rejects_table(plan.rejects))
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
