"""The ``nightshift`` command: ``jobs`` (run, plan, status, export), ``batch`` (run),
``schedule`` (serve, deploy), ``demo`` (init) and ``cache`` (stats, prune)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

import typer

from nightshift.cli.batch import batch_app
from nightshift.cli.batchserve import register as register_batch_serve
from nightshift.cli.cache import cache_app
from nightshift.cli.evaluate import register as register_eval
from nightshift.cli.helptext import reflow_help
from nightshift.cli.jobs import jobs_app
from nightshift.cli.schedule import schedule_app
from nightshift.cli.tune import register as register_tune
from nightshift.demo.cli import demo_app
from nightshift.pipelines import stops

EXIT_GRACE_S = 20.0  # the most a finished command waits for its exit handlers

app = typer.Typer(
    help="Offline bulk LLM generation over Parquet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
register_eval(jobs_app)  # `jobs eval`, beside `jobs export`
register_tune(jobs_app)  # `jobs tune`, beside `jobs plan`
app.add_typer(jobs_app, name="jobs")
register_batch_serve(batch_app)  # `batch serve`, beside `batch run`
app.add_typer(batch_app, name="batch")
app.add_typer(demo_app, name="demo")
app.add_typer(schedule_app, name="schedule")
app.add_typer(cache_app, name="cache")
reflow_help(app)  # one line per help paragraph: Rich wraps it to the terminal


def main() -> None:
    """The ``nightshift`` console script: the Typer app, then a quick exit.

    A run that loaded vLLM, torch, polars and Prefect spends 3-4 s in the interpreter's
    teardown, freeing every module's objects one at a time, after its summary is on the
    screen and every file is written. So once the command is done, the threads are
    joined and the exit handlers run, as at any exit (Prefect sends its last logs and
    stops its temporary server, logging flushes), and the process ends there
    (``os._exit``) with the command's exit code. In-process callers (tests,
    ``typer.testing``) call ``app`` and keep their interpreter.

    SIGTERM and SIGINT are handled from the first line (``stops.install_process_handlers``),
    so a signal before a flow body exists still unwinds the command and stops what it
    started. The exit handlers get ``EXIT_GRACE_S`` (little when Prefect's temporary
    server is gone: its log and event workers would wait on it for a minute); then the
    process ends all the same, with every process it started.
    """
    stops.install_process_handlers()
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    grace = 1.0 if stops.prefect_api_gone(ask=False) else EXIT_GRACE_S
    threading.Thread(target=_exit_anyway, args=(grace, code or 0), daemon=True).start()
    # What the interpreter's own exit does first, in its order: wait for the threads
    # that are not daemons and run their hooks (Prefect drains its log and event
    # workers there, while its server still answers), then the exit handlers.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def _exit_anyway(after_s: float, code: int) -> None:
    time.sleep(after_s)
    stops.exit_now(code)


if __name__ == "__main__":
    main()
