"""The ``nightshift`` command: ``jobs`` (run, plan) and ``demo`` (init)."""

from __future__ import annotations

import typer

from nightshift.demo.cli import demo_app
from nightshift.jobs.cli import jobs_app

app = typer.Typer(
    help="Offline bulk LLM generation over Parquet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(jobs_app, name="jobs")
app.add_typer(demo_app, name="demo")

if __name__ == "__main__":
    app()
