"""The ``nightshift`` command: ``jobs`` (run, plan, status, export), ``batch`` (run),
``schedule`` (serve, deploy), ``demo`` (init) and ``cache`` (stats, prune)."""

from __future__ import annotations

import typer

from nightshift.cli.batch import batch_app
from nightshift.cli.batchserve import register as register_batch_serve
from nightshift.cli.cache import cache_app
from nightshift.cli.jobs import jobs_app
from nightshift.cli.schedule import schedule_app
from nightshift.demo.cli import demo_app

app = typer.Typer(
    help="Offline bulk LLM generation over Parquet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(jobs_app, name="jobs")
register_batch_serve(batch_app)  # `batch serve`, beside `batch run`
app.add_typer(batch_app, name="batch")
app.add_typer(demo_app, name="demo")
app.add_typer(schedule_app, name="schedule")
app.add_typer(cache_app, name="cache")

if __name__ == "__main__":
    app()
