"""``nightshift schedule serve | deploy``: nightly jobs in Prefect."""

from __future__ import annotations

from pathlib import Path

import typer

from nightshift.cli.jobs import user_errors

schedule_app = typer.Typer(
    help="Run job specs on their cron schedules (nightly), through Prefect.",
    no_args_is_help=True,
)

SPECS = typer.Argument(
    ..., help="A folder of job specs; those with a `schedule` section are scheduled."
)


@schedule_app.command("serve")
@user_errors
def serve(directory: Path = SPECS) -> None:
    """Run the scheduled specs in a folder from this process, each when its cron comes.

    One Prefect deployment per spec with a schedule section, served from this process;
    stop with Ctrl-C. Reports to PREFECT_API_URL.
    """
    from nightshift.pipelines.stops import python_signal_defaults
    from nightshift.pipelines.tempserver import prefect_defaults

    python_signal_defaults()  # Prefect's runner stops its flow runs on Ctrl-C itself
    prefect_defaults(quiet=False)
    from nightshift.pipelines.schedules import serve_specs

    serve_specs(directory)


@schedule_app.command("deploy")
@user_errors
def deploy(
    directory: Path = SPECS,
    pool: str = typer.Option(..., "--pool", help="The Prefect work pool whose workers run them."),
) -> None:
    """Register the scheduled specs in a folder with a Prefect work pool.

    One deployment per spec with a schedule section; Prefect workers on the GPU
    machines (prefect worker start --pool POOL) run the jobs.
    """
    from nightshift.pipelines.tempserver import prefect_defaults

    prefect_defaults(quiet=False)
    from nightshift.pipelines.schedules import deploy_specs

    for name in deploy_specs(directory, pool):
        typer.echo(f"deployed {name} to work pool {pool}")
