"""A job as a Prefect flow: a plan task, one task per shard, a report task.

``nightshift jobs run SPEC`` calls this flow in-process; ``nightshift schedule serve``
and ``deploy`` run it on a schedule. The tasks are thin: each calls one step of
``running`` and ``reports`` (``start_run``, ``ShardRunner.run``, ``finish_run``), so a run with and
without Prefect is the same run.

- Shards are mapped, never records (about 8 ms of Prefect overhead per task).
- A shard task runs its shard on the flow's engine, built on first use and kept warm
  across shards, rebuilt after a crash. A shard whose engine dies fails its task;
  Prefect retries it ``run.shard_attempts - 1`` times after ``run.retry_delay_s``, and
  the retry continues from the shard's checkpoints.
- Shard tasks run one at a time per engine, and the flow holds a slot of the host's
  GPU concurrency limit (``pipelines.slots``) while its engine is up, so two jobs on
  one machine queue instead of loading two engines onto one GPU.
- SIGTERM, Ctrl-C or a Prefect cancellation stops the run gracefully
  (``pipelines.stops``): the report is written marked ``stopped`` and the flow run ends
  Cancelled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from contextlib import ExitStack
from datetime import datetime
from typing import Any

from prefect import flow, task, unmapped
from prefect.cache_policies import NONE
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from nightshift.errors import RunStoppedError, ShardAttemptFailed, ShardsFailedError
from nightshift.jobs.loading import load_spec
from nightshift.jobs.spec import JobSpec
from nightshift.pipelines.artifacts import publish_report
from nightshift.pipelines.canary import check_canary
from nightshift.pipelines.direct import run_job
from nightshift.pipelines.runclock import clock_start
from nightshift.pipelines.slots import gpu_slot, try_gpu_slot
from nightshift.pipelines.stops import (
    GracefulStop,
    cancelled_state,
    graceful_stop,
    prefect_api_gone,
)
from nightshift.reports.assemble import finish_run
from nightshift.running.canary import canary_pending
from nightshift.running.encoding import close_spare
from nightshift.running.engines import EnginePool, check_engine_spec
from nightshift.running.feeding import FeedingLoop
from nightshift.running.runner import JobRun, raise_if_failed, start_run, work_may_be_left

FLOW_NAME = "nightshift-job"
SHARDS_AHEAD = 4  # shard tasks running at once: one generating, the next ones queued


def _only_engine_deaths(task, task_run, state) -> bool:
    """Retry a shard only when its engine died; a job-level error (every record failing
    alike, a bad schema) would fail the same way again."""
    try:
        state.result()
    except ShardAttemptFailed:
        return True
    except Exception:
        return False
    return False


@task(name="plan", task_run_name="plan", cache_policy=NONE)
def plan_task(
    spec: JobSpec, overwrite: bool, new_run: bool, progress: bool, started: float
) -> JobRun:
    """Plan the job (or take up its plan, adding new records); list the shards left."""
    return start_run(
        spec,
        overwrite=overwrite,
        new_run=new_run,
        progress=progress,
        retry_in_place=False,
        started=started,
    )


@task(
    name="shard",
    task_run_name="shard-{shard}",
    cache_policy=NONE,
    # No tags: Prefect asks its server for a concurrency slot of every tag a task run
    # carries, limit or none, before the task starts (measured: up to 2 s before the
    # first shard on a busy 2-core machine, the engine idle meanwhile). The host's GPU
    # slot (pipelines.slots) is what keeps jobs from sharing an engine's GPU.
    retry_condition_fn=_only_engine_deaths,
)
def shard_task(shard: int, feeding: FeedingLoop) -> int:
    """Run one shard to its commit (continuing from its checkpoints on a retry): hand it
    to the run's feeding loop, which keeps one engine busy across shards, and wait."""
    return feeding.run(shard)


@task(name="report", task_run_name="report", cache_policy=NONE)
def report_task(job: JobRun, engines: EnginePool) -> dict[str, Any]:
    """Write report.json, report.md and the chart; publish them as flow-run artifacts."""
    outcome = finish_run(job, engines)
    publish_report(outcome.report)
    return outcome.report


def shard_task_for(spec: JobSpec):
    """The shard task with the spec's retries: engine deaths only, after a delay."""
    return shard_task.with_options(
        retries=spec.run.shard_attempts - 1, retry_delay_seconds=spec.run.retry_delay_s
    )


def running_job_name() -> str:
    """The job name of the flow run being named (its spec, as the run will load it)."""
    parameters = flow_run.parameters
    return load_spec(parameters["spec_path"], parameters.get("overrides")).name


def _flow_run_name() -> str:
    """The job's name and the start time, e.g. classify-tickets-20261130-020000."""
    return f"{running_job_name()}-{datetime.now():%Y%m%d-%H%M%S}"


@flow(
    name=FLOW_NAME,
    flow_run_name=_flow_run_name,
    # Shard tasks only wait on the feeding loop; a few at once keep its queue full.
    task_runner=ThreadPoolTaskRunner(max_workers=SHARDS_AHEAD),
    validate_parameters=True,
)
def job_flow(
    spec_path: str,
    overrides: list[str] | None = None,
    overwrite: bool = False,
    new_run: bool = False,
    progress: bool = False,
    workers: int = 1,
) -> dict[str, Any]:
    """Run one nightshift job spec: plan, shards, report. Resumes and adds new records
    when rerun into the same output. ``workers`` > 1 runs the shards in that many
    worker processes on this machine, one engine each (``pipelines.workers``)."""
    # The run's clock: from the head start (``pipelines.headstart``) when this process
    # set one up, since the engine may have begun starting before the flow.
    began = clock_start() or time.perf_counter()
    spec = load_spec(spec_path, overrides)
    with graceful_stop(spec.run.stop_s, flow_run.get_id()) as stop:
        engines = EnginePool(spec)
        stop.on_stop(engines.abandon_start)  # an engine still starting is not waited for
        stop.on_kill(engines.kill)
        try:
            with ExitStack() as gpu:
                early = workers == 1 and spec.run.overlap_startup
                early = early and work_may_be_left(spec, overwrite, new_run)
                early = early and not canary_pending(spec, overwrite, new_run)
                if early and try_gpu_slot(gpu, spec):
                    engines.start_early()  # its start-up runs while the plan is built
                else:
                    early = False
                check_engine_spec(spec)
                job = plan_task(spec, overwrite, new_run, progress and workers == 1, began)
                if job.todo and workers > 1 and not stop.requested.is_set():
                    stop.on_stop(lambda: _stop_workers(stop))
                    with gpu_slot(spec):
                        check_canary(job, engines, run_job)  # its engines, then the workers'
                        engines.close()
                    close_spare(spec)  # the workers encode for their own feeds
                    _run_workers(spec, job, engines, spec_path, overrides or [], workers)
                elif job.todo and not stop.requested.is_set():
                    if not early:
                        gpu.enter_context(gpu_slot(spec))
                    check_canary(job, engines, run_job)
                    _run_shards(spec, job, engines, stop)
                engines.close()  # free the GPU before its slot
        finally:
            engines.close()  # a failed plan: the engine that was starting is shut down
            close_spare(spec)  # encoding processes no feed took (workers fed, or none ran)
        if stop.requested.is_set():
            return _stopped(job, engines, stop)
    report = report_task(job, engines)
    raise_if_failed(job)
    if not report["shards"]["complete"]:  # every worker died, or gave the rest up
        raise ShardsFailedError(
            f"{report['shards']['count'] - report['shards']['committed']} shard(s) left "
            "uncommitted when the workers stopped; rerun the same command to finish them"
        )
    return report


def _stopped(job: JobRun, engines: EnginePool, stop: GracefulStop):
    """Write the report of a stopped run, marked so, and end the flow run Cancelled.
    Not through ``report_task``: a cancelling flow run's tasks may not start."""
    outcome = finish_run(job, engines, stopped=stop.describe(job.progress.started))
    stop.report = outcome.report  # before Prefect's calls: its API may be gone (a stop)
    if not prefect_api_gone():
        with contextlib.suppress(Exception):  # artifacts are a copy; report.json is written
            publish_report(outcome.report)
    return cancelled_state(stop)


def _stop_workers(stop: GracefulStop) -> None:
    """Pass a stop on to the local worker processes (``--workers N``). Not a Ctrl-C: the
    terminal sent it to the workers too, and a second one would make them exit at once."""
    import psutil

    if stop.why == "SIGINT":
        return
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            line = child.cmdline()
            if "work" in line and "--worker" in line:
                os.kill(child.pid, signal.SIGTERM)


def _run_workers(
    spec: JobSpec, job: JobRun, engines: EnginePool, spec_path: str, overrides: list[str], n: int
) -> None:
    """Run the shards in ``n`` local worker processes; take their figures for the report."""
    from nightshift.pipelines.launch import local_workers_task
    from nightshift.running.workerstats import absorb_worker_figures, read_worker_figures

    if job.output.location != spec.output.path:  # --new-run: the workers write there too
        overrides = [*overrides, f"output.path={job.output.location}"]
    local_workers_task(spec, spec_path, overrides, n)
    figures = read_worker_figures(job, since=job.progress.started_at.timestamp())
    absorb_worker_figures(job, engines, figures)


def _run_shards(spec: JobSpec, job: JobRun, engines: EnginePool, stop: GracefulStop) -> None:
    """Map the shards onto one feeding loop, wait for all of them, re-raise a job-level
    error if one stopped. A few shard tasks run at once, so the loop always holds the
    next shard before the current one commits."""
    feeding = FeedingLoop(job.runner, engines)
    feeding.expect(job.todo)  # the plan's order, not the order the tasks start in
    stop.on_stop(lambda: feeding.request_stop(f"the run was stopped ({stop.why})"))
    try:
        futures = shard_task_for(spec).map(shard=job.todo, feeding=unmapped(feeding))
        futures.wait()
    finally:
        feeding.close()
    for future in futures:
        if future.state.is_failed():
            error = future.result(raise_on_failure=False)
            if stop.requested.is_set():
                continue  # stopped, or not started in a cancelling flow run: rerun them
            if not isinstance(error, ShardAttemptFailed | RunStoppedError):
                raise error
