"""``nightshift jobs run``: the job flow, run once in this process.

With ``PREFECT_API_URL`` set the run reports to that server; without it Prefect starts
its temporary local server for the run. Either way Prefect's own console logging is
turned down, so the screen shows nightshift's progress bar, its warnings and the summary;
everything Prefect logs still reaches the server (the UI's flow-run page). Pass
``verbose`` to see Prefect's console logs too. Settings the user has set win.

SIGTERM, a first Ctrl-C or a cancellation of the flow run stop it gracefully: the flow
body handles them (``pipelines.stops``; Prefect's own SIGTERM handler is replaced only
while it runs), the flow run ends Cancelled, and the report returned here is marked
``stopped`` (the CLI exits with code 3).
"""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from nightshift.console import ScreenHandler, engine_output_to, kept_log
from nightshift.jobs.loading import load_spec
from nightshift.pipelines import stops, tempserver
from nightshift.pipelines.tempserver import prefect_defaults


def run_flow_once(
    spec_path: str,
    overrides: list[str] | None,
    *,
    overwrite: bool = False,
    new_run: bool = False,
    progress: bool = False,
    verbose: bool = False,
    workers: int = 1,
    exit_on_overrun: bool | None = None,
) -> dict[str, Any]:
    """Run the job flow in this process and return its report. Unless ``verbose``, the
    engine's own output goes to a log file (``report["engine_log"]``), not the screen.
    ``exit_on_overrun``: a stop past run.stop_s ends the process (a CLI whose whole life
    is this job); otherwise (``batch serve``) it abandons the run, never the process.
    None: as the enclosing ``stops.overrun_exits`` says (``batch run``), else False."""
    overrun = contextlib.nullcontext() if exit_on_overrun is None else None
    with overrun or stops.overrun_exits(bool(exit_on_overrun)):
        return _run_flow_once(spec_path, overrides, overwrite, new_run, progress, verbose, workers)


def _run_flow_once(spec_path, overrides, overwrite, new_run, progress, verbose, workers):
    prefect_defaults(quiet=not verbose)
    spec = load_spec(spec_path, overrides)
    log = None if verbose else engine_log_path(spec.output.path)
    with engine_output_to(log) if log else contextlib.nullcontext():
        tempserver.launch_early()  # its boot overlaps Prefect's import, here
        import prefect  # noqa: F401  (its logging set-up comes before nightshift's handler)

        from nightshift.pipelines.headstart import head_start

        _show_nightshift_warnings()
        with head_start(spec, overwrite=overwrite, new_run=new_run, workers=workers):
            from nightshift.pipelines.flow import job_flow  # imported by the head start

            report = _unless_stopped(
                job_flow,
                spec_path=str(spec_path),
                overrides=list(overrides or []),
                overwrite=overwrite,
                new_run=new_run,
                progress=progress,
                workers=workers,
            )
    if log and kept_log(log):
        report["engine_log"] = str(log)
    return report


def engine_log_path(output: str, name: str = "engine") -> Path:
    """Where a run keeps what the engine printed: beside a local output
    (``OUTPUT.logs/``), or under ``.nightshift/logs/`` here for an S3 output."""
    stamp = f"{name}-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"
    if output.startswith("s3://"):
        return Path(".nightshift", "logs", output.removeprefix("s3://").replace("/", "_"), stamp)
    return Path(f"{Path(output).expanduser().as_posix().rstrip('/')}.logs", stamp)


def run_worker(spec_path: str, overrides: list[str] | None, worker: str) -> dict[str, Any]:
    """Run one worker flow in this process (``nightshift jobs work``, a process whose
    whole life is this worker: a stop past run.stop_s ends it)."""
    prefect_defaults(quiet=True)
    log = engine_log_path(load_spec(spec_path, overrides).output.path, worker)
    with engine_output_to(log), stops.overrun_exits():
        from nightshift.pipelines.workers import worker_flow  # imports Prefect

        tempserver.for_a_worker()
        _show_nightshift_warnings()
        done = _unless_stopped(
            worker_flow, spec_path=str(spec_path), worker=worker, overrides=list(overrides or [])
        )
    return {**done, **({"engine_log": str(log)} if kept_log(log) else {})}


def _unless_stopped(flow, **parameters) -> dict[str, Any]:
    """Run ``flow``; a flow run that was stopped gracefully ends Cancelled (which Prefect
    raises here): return its report, marked ``stopped``, instead."""
    before = stops.last_stop()
    try:
        return flow(**parameters)
    except Exception:
        stop = stops.last_stop()
        if stop is None or stop is before or stop.report is None:
            raise
        return stop.report
    finally:
        stops.flow_returned(before)  # a stop waiting on Prefect's last calls waits no more


def _show_nightshift_warnings() -> None:
    """nightshift's own warnings (an engine died, a shard retries) go to stderr even
    with Prefect's console handler turned down."""
    logger = logging.getLogger("nightshift")
    if not any(getattr(h, "_nightshift", False) for h in logger.handlers):
        handler = ScreenHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        handler.setLevel(logging.WARNING)
        handler._nightshift = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
