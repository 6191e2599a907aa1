"""``nightshift batch serve``: the self-hosted OpenAI and Anthropic batch APIs.

A bad setting (a public host without a key, a missing model folder or adapter, a bad
``--set``, a port another server holds) prints one message and exits with code 2
before anything listens. SIGTERM or Ctrl-C shut it down gracefully
(exit code 0): the running batch's job stops and resumes at the next start.
"""

from __future__ import annotations

import os

import typer

from nightshift.cli.batch import ADAPTERS, adapter_options
from nightshift.cli.jobs import user_errors
from nightshift.pipelines.stops import SignalStop, raising_signals

KEY_ENV = "NIGHTSHIFT_API_KEY"


@user_errors
def serve(
    model: str = typer.Option(..., "--model", help="The local model folder to serve."),
    store: str = typer.Option(
        ..., "--store", help="Where files, batches and their jobs live: a directory or s3://."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="The address to listen on."),
    port: int = typer.Option(8000, "--port", help="The port to listen on."),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        help=f"The key clients must send (also read from {KEY_ENV}); required off loopback.",
        show_default=False,
    ),
    served_names: list[str] = typer.Option(
        None, "--served-model-name", help="A model name requests may give (repeatable)."
    ),
    overrides: list[str] = typer.Option(
        None, "--set", help="A spec key for every batch's job, e.g. --set engine.max_num_seqs=64."
    ),
    max_upload_mb: int = typer.Option(200, "--max-upload-mb", min=1, help="Upload size limit."),
    max_upload_lines: int = typer.Option(
        50_000, "--max-upload-lines", min=1, help="Requests per batch limit."
    ),
    adapters: list[str] = ADAPTERS,
    expire_after_s: int = typer.Option(
        24 * 3600,
        "--expire-after",
        min=1,
        help="Seconds a batch may take from its creation (the providers' 24h window); "
        "past it its unfinished requests end expired and what finished is kept.",
    ),
    public_url: str | None = typer.Option(
        None,
        "--public-url",
        help="The URL clients reach the server at (behind a proxy, say), which links "
        "such as Anthropic's results_url start with; default http://HOST:PORT.",
        show_default=False,
    ),
) -> None:
    """Serve the OpenAI and Anthropic batch APIs on a local model.

    The OpenAI Batch API (/v1/files, /v1/batches, /v1/models) and the Anthropic Message
    Batches API (/v1/messages/batches). Each batch runs as a nightshift job, one at a
    time, first in first out; everything lives in --store, so a server killed and
    started again carries every unfinished batch on where it stopped. Beyond loopback
    it needs a key (--api-key or NIGHTSHIFT_API_KEY).

    Example:

      NIGHTSHIFT_API_KEY=... nightshift batch serve --model ./qwen --store s3://bucket/b \
          --host 0.0.0.0 --public-url http://gpu-box:8000
    """
    from nightshift.batch.execute import ServeSettings, check_settings
    from nightshift.batch.http import check_public_url
    from nightshift.batch.server import check_exposure, serve

    key = api_key or os.environ.get(KEY_ENV) or None
    check_exposure(host, key)
    settings = ServeSettings(
        model=model,
        store=store,
        host=host,
        port=port,
        api_key=key,
        served_names=list(served_names or []),
        overrides=list(overrides or []),
        max_bytes=max_upload_mb * 1024 * 1024,
        max_lines=max_upload_lines,
        expire_after_s=expire_after_s,
        adapters=adapter_options(adapters or []),
        public_url=check_public_url(public_url) if public_url is not None else None,
    )
    check_settings(settings)
    _log_batches()
    typer.echo(f"nightshift batch serve: http://{host}:{port}/v1 (store {store})", err=True)
    try:
        with raising_signals():
            serve(settings)
    except SignalStop:
        # SIGTERM or Ctrl-C: uvicorn shut down gracefully (the running batch stopped and
        # resumes at the next start), then raised the signal again to end the process.
        typer.echo(
            "nightshift batch serve: stopped; unfinished batches resume at the next start", err=True
        )


def _log_batches() -> None:
    """A line on stderr per step of each batch (received, started, its counts while it
    runs, ended), with the time: ``lifecycle.announce``."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger = logging.getLogger("nightshift.batch")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False  # one line each, whatever else configures the root logger


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
