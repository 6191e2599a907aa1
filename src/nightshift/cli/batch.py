"""``nightshift batch run``: provider batch files (OpenAI, Anthropic) on your own GPUs.

Exit codes as ``jobs run``: 2 for a mistake the user can fix (a missing model or input,
a bad --set), 1 when the engine or the run fails, 3 after a graceful stop.
"""

from __future__ import annotations

import typer

from nightshift.cli.jobs import user_errors
from nightshift.errors import RunStoppedError

batch_app = typer.Typer(
    help="Provider batch files (OpenAI, Anthropic) run as nightshift jobs.", no_args_is_help=True
)


# --adapter, as batch run and batch serve take it (adapter_options reads it)
ADAPTERS = typer.Option(
    None,
    "--adapter",
    help="NAME=FOLDER: a LoRA adapter; a request whose model is NAME runs under it "
    "(repeatable; batch serve's /v1/models lists it).",
)


@batch_app.command("run")
@user_errors
def run(
    input_file: str = typer.Argument(
        ..., metavar="INPUT", help="The batch file (JSONL), local or s3://.", show_default=False
    ),
    output_file: str = typer.Argument(
        ...,
        metavar="OUTPUT",
        help="Where the result lines go (JSONL), local or s3://.",
        show_default=False,
    ),
    model: str = typer.Option(..., "--model", help="The local model folder to serve."),
    errors: str = typer.Option(
        None, "--errors", help="Where failed requests go (default: OUTPUT's name + .errors.jsonl)."
    ),
    fmt: str = typer.Option("auto", "--format", help="openai, anthropic or auto (from the lines)."),
    served_model_name: list[str] = typer.Option(
        None,
        "--served-model-name",
        help="A model name requests may give (repeatable; default: the model folder's name).",
    ),
    overrides: list[str] = typer.Option(
        None,
        "--set",
        help="Override a job setting: model.max_model_len, engine.*, plan.*, run.*, cost.* "
        "(repeatable).",
    ),
    work: str = typer.Option(
        None, "--work", help="The batch's working state (default: OUTPUT.nightshift/ beside it)."
    ),
    adapters: list[str] = ADAPTERS,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Run an OpenAI or Anthropic batch file on a local model, into the provider's format.

    Answers go to OUTPUT and failed requests to ERRORS, in the provider's own line
    shapes; a bad line is an error line and the batch goes on. Rerun the same command to
    resume after a kill or a stop.

    Examples:

      nightshift batch run requests.jsonl results.jsonl --model ./models/qwen2.5-7b
      nightshift batch run in.jsonl out.jsonl --model ./qwen --served-model-name gpt-4o-mini
      nightshift batch run in.jsonl out.jsonl --model ./qwen --adapter support=./lora/support
    """
    from nightshift.batch.run import run_batch
    from nightshift.pipelines.stops import overrun_exits

    with overrun_exits():  # this process's whole life is this batch: a stop may end it
        outcome = run_batch(
            input_file,
            output_file,
            model=model,
            errors_url=errors,
            fmt=fmt,
            served_names=served_model_name or None,
            overrides=overrides or None,
            work_url=work,
            progress=not quiet,  # a bar on a terminal, else a line every 30 s (a log)
            adapters=adapter_options(adapters or []),
        )
    if outcome.stopped:
        typer.echo(
            "stopped: the answers held are checkpointed; rerun the same command to answer "
            f"the rest (working state: {outcome.work})",
            err=True,
        )
        raise typer.Exit(RunStoppedError.exit_code)
    where = f"{outcome.output}" + (f", errors: {outcome.errors}" if outcome.errors else "")
    typer.echo(
        f"batch: {outcome.completed:,} completed, {outcome.failed:,} failed of "
        f"{outcome.total:,} requests; tokens: {outcome.input_tokens:,} in "
        f"({outcome.cached_tokens:,} cached), {outcome.output_tokens:,} out; output: {where}"
    )
    if outcome.report:
        typer.echo(cost_line(outcome.report))


def cost_line(report: dict) -> str:
    """This run's time, what it cost (or why no price applies) and where its report is."""
    times, cost = report.get("time_s") or {}, report.get("cost") or {}
    took = (
        f"time: {times.get('total', 0):,.1f} s (engine start-up "
        f"{times.get('engine_startup', 0):,.1f} s, generation {times.get('generate', 0):,.1f} s)"
    )
    if cost.get("priced"):
        per = (cost.get("usd_per_million_tokens") or {}).get("total", 0)
        price = f"cost: ${cost.get('usd_total', 0):,.4f} (${per:,.4f} per 1M tokens)"
    else:
        price = f"cost: {cost.get('note') or 'not priced'}"
    return f"{took}; {price}; report: {report.get('report', '')}"


def adapter_options(items: list[str]) -> dict[str, str]:
    """--adapter NAME=FOLDER, repeated: name -> folder."""
    from nightshift.errors import UserError

    found = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise UserError(f"--adapter {item!r}: give NAME=FOLDER, e.g. --adapter support=./lora")
        found[name.strip()] = folder.strip()
    return found
