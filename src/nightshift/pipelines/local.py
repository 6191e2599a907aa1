"""``nightshift jobs run``: the job flow, run once in this process.

With ``PREFECT_API_URL`` set the run reports to that server; without it Prefect starts
its temporary local server for the run. Either way Prefect's own console logging is
turned down, so the screen shows nightshift's progress bar, its warnings and the summary;
everything Prefect logs still reaches the server (the UI's flow-run page). Pass
``verbose`` to see Prefect's console logs too. Settings the user has set win.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

# Applied before Prefect is imported (its settings are read then).
_QUIET_PREFECT = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Two busy cores can take longer than Prefect's 20 s default to start the server.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    # Prefect's usage telemetry (and its first-run notice): off unless the user opts in.
    "DO_NOT_TRACK": "1",
}


def run_flow_once(
    spec_path: str,
    overrides: list[str] | None,
    *,
    overwrite: bool = False,
    new_run: bool = False,
    progress: bool = False,
    verbose: bool = False,
    workers: int = 1,
) -> dict[str, Any]:
    """Run the job flow in this process and return its report."""
    prefect_defaults(quiet=not verbose)
    from nightshift.pipelines.flow import job_flow  # imports Prefect

    _show_nightshift_warnings()
    return job_flow(
        spec_path=str(spec_path),
        overrides=list(overrides or []),
        overwrite=overwrite,
        new_run=new_run,
        progress=progress,
        workers=workers,
    )


def run_worker(spec_path: str, overrides: list[str] | None, worker: str) -> dict[str, Any]:
    """Run one worker flow in this process (``nightshift jobs work``)."""
    prefect_defaults(quiet=True)
    from nightshift.pipelines.workers import worker_flow  # imports Prefect

    _show_nightshift_warnings()
    return worker_flow(spec_path=str(spec_path), worker=worker, overrides=list(overrides or []))


def prefect_defaults(quiet: bool) -> None:
    """Set nightshift's Prefect defaults where the user has not set them; call before
    Prefect is imported."""
    for key, value in _QUIET_PREFECT.items():
        if quiet or key != "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL":
            os.environ.setdefault(key, value)


def _show_nightshift_warnings() -> None:
    """nightshift's own warnings (an engine died, a shard retries) go to stderr even
    with Prefect's console handler turned down."""
    logger = logging.getLogger("nightshift")
    if not any(getattr(h, "_nightshift", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        handler.setLevel(logging.WARNING)
        handler._nightshift = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
