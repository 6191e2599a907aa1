"""``nightshift demo init``: build the demo model and tickets locally."""

from __future__ import annotations

from pathlib import Path

import typer

demo_app = typer.Typer(help="The demo model and dataset, built locally.", no_args_is_help=True)


@demo_app.command("init")
def init(
    dir: Path = typer.Option(Path(".nightshift"), "--dir", help="Where the demo models go."),
    data: Path = typer.Option(Path("data/demo/tickets"), "--data", help="Where the tickets go."),
    records: int = typer.Option(20_000, help="How many tickets to generate."),
    files: int = typer.Option(8, help="How many Parquet files to spread them over."),
) -> None:
    """Build a tiny random Llama (local BPE tokenizer, chat template) and synthetic tickets."""
    from nightshift.demo.builder import init_demo

    paths = init_demo(dir, data, records, files)
    typer.echo(f"model: {paths.model}\nmodel without chat template: {paths.plain_model}")
    typer.echo(f"tickets: {records:,} records in {paths.data}/")
