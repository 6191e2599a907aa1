"""The host's GPU concurrency limit: one Prefect global concurrency limit per machine.

A flow holds ``engine.extra.tensor_parallel_size`` slots (default 1) of
``nightshift-gpu-<host>`` while its engine is up. The limit has one slot per GPU on the
host (one on a machine without GPUs), so a second job on the same machine waits for the
GPU instead of loading a second engine next to the first. nightshift creates the limit
when it is missing and never changes one that exists: set your own with
``prefect gcl create nightshift-gpu-<host> --limit N``. Slots are leased: a flow that
dies frees its slots when the lease runs out.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from nightshift.jobs.spec import JobSpec


def limit_name() -> str:
    return f"nightshift-gpu-{socket.gethostname()}"


def gpus_on_host() -> int:
    """NVIDIA devices this machine shows, and 1 for a machine without any."""
    return max(1, len(list(Path("/dev").glob("nvidia[0-9]*"))))


def ensure_limit(name: str, slots: int) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            # Another flow may create it between the read and here: that is fine.
            with suppress(ObjectAlreadyExists):
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=slots)
                )


@contextmanager
def gpu_slot(spec: JobSpec) -> Iterator[None]:
    """Hold this job's share of the host's GPUs while the block runs."""
    name, occupy = limit_name(), int(spec.engine.extra.get("tensor_parallel_size", 1))
    ensure_limit(name, max(gpus_on_host(), occupy))
    with concurrency(name, occupy=occupy, strict=True):
        yield
