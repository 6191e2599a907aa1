"""A job run in this process without Prefect: the same steps the flow's tasks call
(``running.runner.start_run``, ``ShardRunner.run``, ``reports.assemble.finish_run``).
Tests and benchmarks use it to run a job on an engine they already hold."""

from __future__ import annotations

import time

from nightshift.engines.base import Engine
from nightshift.jobs.spec import JobSpec
from nightshift.pipelines.canary import check_canary
from nightshift.reports.assemble import RunOutcome, finish_run
from nightshift.running.canary import canary_pending
from nightshift.running.encoding import close_spare
from nightshift.running.engines import EnginePool, check_engine_spec
from nightshift.running.runner import raise_if_failed, start_run, work_may_be_left


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
    began, engines = time.perf_counter(), EnginePool(spec, engine)
    try:
        if engine is None:
            early = spec.run.overlap_startup and work_may_be_left(spec, overwrite, new_run)
            if early and not canary_pending(spec, overwrite, new_run):
                engines.start_early()  # start-up (and importing vLLM) overlaps planning
            check_engine_spec(spec)
        job = start_run(
            spec, overwrite=overwrite, new_run=new_run, progress=progress, started=began
        )
        check_canary(job, engines, run_job)
        job.runner.run(job.todo, engines)
    finally:
        engines.close()
        close_spare(spec)  # encoding processes no feed took (a canary failed, say)
    outcome = finish_run(job, engines)
    raise_if_failed(job)
    return outcome
