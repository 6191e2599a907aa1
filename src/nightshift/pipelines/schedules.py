"""Nightly jobs: one Prefect deployment per spec that carries a ``schedule``.

- ``serve``: this process runs the flows when their cron comes (Prefect ``serve``); the
  simplest way to run nightly jobs on one machine. Ctrl-C (or SIGTERM) stops it and
  pauses the schedules.
- ``deploy``: register the deployments against a work pool, so Prefect workers on the
  GPU machines run them; nothing keeps running here. The flow's entrypoint is the
  installed module ``nightshift.pipelines.flow:job_flow``, so a worker needs nightshift
  installed (``pip install nightshift[gpu]``), and the spec file and its input at the
  same paths (or on S3).

Each deployment runs its job at most once at a time: a night that starts while the last
is still running waits for it (``collision_strategy=ENQUEUE``). Runs are incremental
(``scheduling.increments``): each night generates only records new since the last.
"""

from __future__ import annotations

from pathlib import Path

from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.client.schemas.schedules import CronSchedule
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from pydantic import ValidationError

from nightshift.errors import SpecError, UserError
from nightshift.jobs.loading import load_spec
from nightshift.jobs.spec import JobSpec
from nightshift.pipelines.flow import job_flow


def scheduled_specs(directory: Path) -> list[tuple[Path, JobSpec]]:
    """The specs in ``directory`` (``*.yaml``, ``*.yml``) that have a ``schedule``."""
    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory; give the folder of nightly specs")
    paths = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    found = [(p.resolve(), load_spec(p)) for p in paths]
    scheduled = [(p, s) for p, s in found if s.schedule is not None]
    if not scheduled:
        raise UserError(
            f"no spec in {directory} has a schedule; add e.g. "
            "`schedule: {cron: '0 2 * * *', timezone: Europe/Berlin}` to one"
        )
    return scheduled


def cron_schedule(spec: JobSpec) -> CronSchedule:
    """Prefect's schedule for ``spec``; a cron Prefect refuses names ``schedule.cron``."""
    try:
        return CronSchedule(cron=spec.schedule.cron, timezone=spec.schedule.timezone)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        fix = "give five cron fields, e.g. '0 2 * * *'"
        raise SpecError("schedule.cron", problem, fix) from None


def deployment(path: Path, spec: JobSpec, work_pool: str | None = None) -> RunnerDeployment:
    """The deployment that runs ``spec`` on its schedule, named after the job."""
    return job_flow.to_deployment(
        name=spec.name,
        schedules=[cron_schedule(spec)],
        parameters={"spec_path": str(path)},
        description=f"nightshift job {spec.name} ({path}), incremental, on {spec.schedule.cron} "
        f"{spec.schedule.timezone}",
        tags=["nightshift"],
        concurrency_limit=ConcurrencyLimitConfig(
            limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE
        ),
        work_pool_name=work_pool,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


def serve_specs(directory: Path) -> None:
    """Serve every scheduled spec in ``directory`` until stopped."""
    from prefect import serve

    serve(*[deployment(p, s) for p, s in scheduled_specs(directory)])


def deploy_specs(directory: Path, work_pool: str) -> list[str]:
    """Register every scheduled spec in ``directory`` with ``work_pool``; return the
    deployments' names (``nightshift-job/<job name>``)."""
    names = []
    for path, spec in scheduled_specs(directory):
        deployment(path, spec, work_pool).apply(work_pool_name=work_pool)
        names.append(f"{job_flow.name}/{spec.name}")
    return names
