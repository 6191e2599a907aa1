"""What one Prefect flow run costs nightshift's temporary server, with and without the
flow-run heartbeat (``pipelines.tempserver._without_heartbeats``).

Boots the temporary server as a run does, then times a one-line flow, alternating:
heartbeats on (Prefect's default, ``flows.heartbeat_frequency`` 30 here), heartbeats
off (as nightshift runs). Prefect joins the heartbeat thread, which sleeps a second at
a time, at the flow's end.

    .venv/bin/python benchmarks/flow_overhead.py [--runs 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/flow_overhead.json")
    args = parser.parse_args()
    from nightshift.pipelines import tempserver

    tempserver.prefect_defaults(quiet=True)
    booting = tempserver.boot()
    if booting is None:
        raise SystemExit("PREFECT_API_URL is set: unset it to time nightshift's temporary server")
    booting.join()
    tempserver.use()
    from prefect import flow
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    @flow
    def one() -> int:
        return 1

    one()  # the first run creates the flow on the server
    seconds: dict[str, list[float]] = {"heartbeats": [], "no_heartbeats": []}
    for _ in range(args.runs):
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
            began = time.perf_counter()
            one()
            seconds["heartbeats"].append(round(time.perf_counter() - began, 3))
        began = time.perf_counter()
        one()
        seconds["no_heartbeats"].append(round(time.perf_counter() - began, 3))
    result = {k: {"each_s": v, "median_s": statistics.median(v)} for k, v in seconds.items()}
    print(json.dumps(result))
    args.out.write_text(json.dumps({"runs": args.runs, **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
