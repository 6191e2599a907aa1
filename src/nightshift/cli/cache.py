"""``nightshift cache stats|prune PATH``: inspect and trim a response cache (``cache.path``)."""

from __future__ import annotations

import json

import typer

from nightshift.cli.jobs import user_errors
from nightshift.io.responsecache import cache_stats, prune

cache_app = typer.Typer(
    help="Inspect and trim a response cache (cache.path).", no_args_is_help=True
)
PATH = typer.Argument(..., help="The cache: a directory or s3://bucket/prefix.", show_default=False)


@cache_app.command("stats")
@user_errors
def stats(path: str = PATH) -> None:
    """Count a response cache's entries, bytes, damaged and old-layout entries."""
    typer.echo(json.dumps(cache_stats(path), indent=2))


@cache_app.command("prune")
@user_errors
def prune_cache(
    path: str = PATH,
    older_than_days: float = typer.Option(
        None, "--older-than-days", min=0, help="Delete answers stored longer ago than this."
    ),
    keep: int = typer.Option(None, "--keep", min=0, help="Keep only the N newest answers."),
) -> None:
    """Trim a response cache by age or count; damaged and old-layout entries always go.

    Only keys shaped like entries are touched: other files under responses/ stay.

    Example:

      nightshift cache prune s3://bucket/cache --older-than-days 30
    """
    seconds = older_than_days * 86400 if older_than_days is not None else None
    deleted = prune(path, older_than_s=seconds, keep=keep)
    typer.echo(f"deleted {deleted} entries from {path}")
