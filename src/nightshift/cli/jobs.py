"""``nightshift jobs run | plan``: the job commands.

User mistakes (a bad spec, a missing file) print one message and exit with code 2; an
engine that cannot start or dies exits with code 1; a run stopped gracefully (SIGTERM,
Ctrl-C, a Prefect cancellation) exits with code 3 once its answers are checkpointed and
its report written (a second signal, or a stop past run.stop_s, exits at once with
128 + the signal's number); only real bugs show a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial, wraps
from pathlib import Path

import typer

from nightshift.errors import NightshiftError, RunStoppedError, UserError

jobs_app = typer.Typer(help="Run and plan bulk generation jobs.", no_args_is_help=True)

SPEC = typer.Argument(..., help="The job spec, a YAML file.", show_default=False)
SET = typer.Option(
    None, "--set", help="Override a spec key, e.g. --set sampling.max_tokens=16 (repeatable)."
)


def user_errors(command: Callable) -> Callable:
    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except NightshiftError as exc:  # engine or run failure: say what, exit 1
            typer.echo(f"failed: {exc}", err=True)
            raise typer.Exit(1) from None

    return wrapper


@jobs_app.command("run")
@user_errors
def run(
    spec: Path = SPEC,
    overrides: list[str] = SET,
    overwrite: bool = typer.Option(
        False, help="Delete the run already in output.path and start from scratch."
    ),
    new_run: bool = typer.Option(
        False, "--new-run", help="Start a fresh run in OUTPUT-runN beside output.path."
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No progress (a bar on a terminal, else a line every 30 s)."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Show the engine's and Prefect's own output too."
    ),
    workers: int = typer.Option(
        1, "--workers", min=1, help="Run the shards in N worker processes, one engine each."
    ),
) -> None:
    """Run a job: plan it, generate with vLLM, write the results and the report.

    The job runs as a Prefect flow, reported to PREFECT_API_URL when set, else to a
    temporary local Prefect server. Rerun the same command to resume (committed shards
    are skipped, partial ones continue) and to add records new in the input. SIGTERM,
    Ctrl-C or a Prefect cancellation stop it gracefully (answers held are checkpointed,
    the report is marked stopped) with exit code 3 within run.stop_s; a second signal
    exits at once.

    Examples:

      nightshift jobs run configs/classify.yaml
      nightshift jobs run job.yaml --set sampling.max_tokens=16 --set run.canary=false
      nightshift jobs run job.yaml --new-run     # a fresh output beside a different job's
    """
    from nightshift.jobs.loading import load_spec
    from nightshift.pipelines.local import run_flow_once
    from nightshift.reports.report import summary_lines

    if overwrite and new_run:
        raise typer.BadParameter("--overwrite and --new-run exclude each other")
    loaded = load_spec(spec, overrides)  # a bad spec fails here, before Prefect starts
    if workers > 1:
        from nightshift.pipelines.launch import check_workers

        check_workers(loaded, workers)  # more workers than GPUs: refused before any start
    report = run_flow_once(
        str(spec),
        overrides,
        overwrite=overwrite,
        new_run=new_run,
        progress=not quiet,  # a bar on a terminal, else a line every 30 s (a log)
        verbose=verbose,
        workers=workers,
        exit_on_overrun=True,  # this process's whole life is this job
    )
    for line in summary_lines(report, report["output"]):
        typer.echo(line)
    typer.echo(f"report: {report['report']} (and report.md beside it)")
    if report.get("engine_log"):
        typer.echo(f"engine log: {report['engine_log']} (the engine's own output; -v shows it)")
    _exit_if_stopped(report)


def _exit_if_stopped(report: dict) -> None:
    stopped = report.get("stopped")
    if stopped:
        typer.echo(
            f"stopped ({stopped['signal']}) after {stopped['at_s']:.1f}s: the answers held "
            "are checkpointed; rerun the same command to answer the rest",
            err=True,
        )
        raise typer.Exit(RunStoppedError.exit_code)


@jobs_app.command("work")
@user_errors
def work(
    spec: Path = SPEC,
    overrides: list[str] = SET,
    worker: str = typer.Option("worker", "--worker", help="A name for this worker's runs."),
) -> None:
    """Join a planned job as one more worker, on one engine.

    The worker claims the job's uncommitted shards one at a time and runs them until
    every shard is committed. Start as many as you have GPUs, on any machine that reaches
    the output; plan the job first (jobs plan --write). SIGTERM, Ctrl-C or a Prefect
    cancellation stop it gracefully, releasing its shards' leases (exit code 3).
    """
    from nightshift.io.leases import check_worker_id
    from nightshift.jobs.loading import load_spec
    from nightshift.pipelines.local import run_worker

    check_worker_id(worker)  # it names files: refuse it before any shard runs, not after
    load_spec(spec, overrides)
    done = run_worker(str(spec), overrides, worker)
    typer.echo(f"{done['worker']}: committed shards {done['shards']}")
    _exit_if_stopped(done)


@jobs_app.command("status")
@user_errors
def status(
    output: str = typer.Argument(..., help="A job's output.path (directory or s3:// prefix)."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Show a job's progress: shards done, partly done and failed; records by state."""
    from nightshift.jobs.status import output_status, status_text

    state = output_status(output)
    typer.echo(json.dumps(state, indent=2) if as_json else status_text(state))


@jobs_app.command("export")
@user_errors
def export(
    output: str = typer.Argument(..., help="A job's output.path."),
    destination: str = typer.Argument(..., help="The Parquet file to write (local or s3://)."),
) -> None:
    """Write a job's committed results as one merged Parquet file (local or S3)."""
    from nightshift.jobs.status import export_results

    target, rows = export_results(output, destination)
    typer.echo(f"wrote {rows:,} records to {target}")


@jobs_app.command("plan")
@user_errors
def plan(
    spec: Path = SPEC,
    overrides: list[str] = SET,
    as_json: bool = typer.Option(False, "--json", help="Print the plan summary as JSON."),
    write: bool = typer.Option(
        False, "--write", help="Also write the plan (shard files) to OUTPUT/plan/, as a run would."
    ),
    gpu: str = typer.Option(None, help="Predict throughput and cost on this GPU (h100, a100...)."),
    gpus: int = typer.Option(None, min=1, help="GPUs for the prediction (default: cost.gpus)."),
    output_tokens: int = typer.Option(None, min=1, help="Expected output tokens per record."),
) -> None:
    """Plan a job without an engine, and show what it will do and cost.

    Records, prompt tokens, rejects by kind, shards, the predicted prefix reuse in
    planned and input order, and the projected cost; with --gpu, the predicted
    throughput, time, cost and binding limit on that GPU.

    Examples:

      nightshift jobs plan job.yaml
      nightshift jobs plan job.yaml --gpu h100 --gpus 8 --output-tokens 200
      nightshift jobs plan job.yaml --write      # write the plan for workers to run
    """
    from nightshift.jobs.loading import load_spec
    from nightshift.running.encoding import planning_processes
    from nightshift.running.runner import input_rows
    from nightshift.scheduling.dryrun import plan_summary, summary_text

    capacity = {"gpu": gpu, "gpus": gpus, "output_tokens": output_tokens} if gpu else None
    job = load_spec(spec, overrides)
    # the processes a run of this job would encode with: the plan is built with them
    helpers = partial(planning_processes, job, records=input_rows(job))
    summary = plan_summary(
        job, progress=sys.stderr.isatty(), write=write, gpu=capacity, helpers=helpers
    )
    typer.echo(json.dumps(summary, indent=2) if as_json else summary_text(summary))
