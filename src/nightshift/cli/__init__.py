"""The ``nightshift`` command: ``jobs`` (run, plan, status, export), ``schedule`` (serve,
deploy), ``demo`` (init) and ``cache`` (stats, prune)."""

from __future__ import annotations

import typer

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
app.add_typer(demo_app, name="demo")
app.add_typer(schedule_app, name="schedule")
app.add_typer(cache_app, name="cache")
# TEMPORARY until `batch run` (cli/batch.py) lands: its batch_app then carries `serve`.
batch_app = typer.Typer(help="Provider batch files and the batch API server.", no_args_is_help=True)
register_batch_serve(batch_app)
app.add_typer(batch_app, name="batch")

if __name__ == "__main__":
    app()
