"""The ``nightshift`` console script: for a command that runs a job (``jobs run``,
``batch run``), Prefect's temporary server is launched before anything else is imported,
then the Typer app runs (``cli.main``).

The server's boot (4-5 s on 2 cores, its own imports) is what a run's start waits on;
launched here, the command's own imports and the spec's reading (about a second) run
beside it instead of before it. ``pipelines.tempserver.launch_early`` decides, as it
does when ``pipelines.local`` calls it: no launch where a server of the user's is in
sight, and the flow takes the server up or stops it. A command that fails before its
flow stops it at exit, as it stops every server it started.
"""

from __future__ import annotations

import sys

RUNS_A_JOB = (("jobs", "run"), ("batch", "run"))


def main() -> None:
    args = sys.argv[1:]
    if tuple(args[:2]) in RUNS_A_JOB and "--help" not in args:
        from nightshift.pipelines import tempserver

        # As the run sets them (``pipelines.local``), before the server reads them; its
        # output goes where a run's engine output goes: the screen with -v, else nowhere
        # (the run's engine log, where it went when launched later, is not open yet).
        verbose = "-v" in args or "--verbose" in args
        tempserver.prefect_defaults(quiet=not verbose)
        tempserver.launch_early(quiet=not verbose)
    from nightshift.cli import main as run_command

    run_command()
