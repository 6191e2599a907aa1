"""``jobs run --workers N``: start N worker processes on this machine and wait for them.

Each process runs ``nightshift jobs work`` (one ``nightshift-worker`` flow run, one
engine) against the same Prefect server as the launching flow. Devices are split, not
shared: on a GPU machine each worker's engine locks ``engine.tensor_parallel_size`` of
the devices the host gives and starts with ``CUDA_VISIBLE_DEVICES`` set to them (more
workers than that many devices are refused before any starts); on a CPU machine with at
least as many cores as workers each worker's vLLM threads are bound to its own cores
(``VLLM_CPU_OMP_THREADS_BIND``).
This is a launcher for one host, not a scheduler: which worker runs which shard is
decided by the leases in the output, exactly as for workers started by a work pool.
"""

from __future__ import annotations

import os
import subprocess
import sys

from prefect import task
from prefect.cache_policies import NONE
from prefect.client.orchestration import get_client

from nightshift.engines.devices import check_device_count, given_devices
from nightshift.jobs.spec import JobSpec


@task(name="workers", task_run_name="start-{count}-workers", cache_policy=NONE)
def local_workers_task(
    spec: JobSpec, spec_path: str, overrides: list[str], count: int
) -> list[int]:
    """Start ``count`` workers, wait for all; their exit codes."""
    check_workers(spec, count)
    with get_client(sync_client=True) as client:
        api_url = str(client.api_url)  # the temporary server's too: one server for all
    sets = [arg for item in overrides for arg in ("--set", item)]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nightshift.cli",
                "jobs",
                "work",
                spec_path,
                *sets,
                "--worker",
                f"worker-{i}",
            ],
            env={**os.environ, "PREFECT_API_URL": api_url, **device_env(spec, i, count)},
        )
        for i in range(count)
    ]
    return [p.wait() for p in processes]


def check_workers(spec: JobSpec, count: int) -> None:
    """Refuse, in one line, more workers than the host's devices hold at once."""
    tp = spec.engine.tensor_parallel_size
    what = f"--workers {count} x engine.tensor_parallel_size {tp}"
    check_device_count(count * tp, given_devices(), what)


def device_env(spec: JobSpec, index: int, count: int) -> dict[str, str]:
    """The devices worker ``index`` of ``count`` may use. On a GPU host: every device
    the host gives (its inherited list, else the driver's); each worker's engine locks
    its own among them (``engines.devices``), so none shares one with another worker or
    with another job. On a CPU host: its own cores, when there are enough."""
    given = given_devices()
    if given is not None:
        return {"CUDA_VISIBLE_DEVICES": ",".join(given)}
    cores = sorted(os.sched_getaffinity(0))
    if count > len(cores):
        return {}  # more workers than cores: let them share
    share = len(cores) // count
    mine = cores[index * share : (index + 1) * share]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, mine))}
