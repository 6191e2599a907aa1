"""The host's GPU concurrency limit: one Prefect global concurrency limit per machine.

A flow holds ``engine.tensor_parallel_size`` slots (default 1) of
``nightshift-gpu-<host>`` while its engine is up. The limit has one slot per GPU on the
host, so a second job on the same machine waits for the GPU instead of loading a second
engine next to the first. A machine without GPUs takes no slot (CPU engines share the
cores) unless ``NIGHTSHIFT_GPU_LIMIT`` names a limit to use. nightshift creates the limit
when it is missing and never changes one that exists: set your own with
``prefect gcl create nightshift-gpu-<host> --limit N``. Set ``NIGHTSHIFT_GPU_LIMIT``
to use another limit (e.g. one per group of GPUs a host splits between jobs). Slots are
leased: a flow that dies frees its slots when its lease runs out, within
``LEASE_SECONDS``; a rerun right after a crash says so while it waits.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from nightshift.engines.devices import given_devices
from nightshift.jobs.spec import JobSpec

log = logging.getLogger(__name__)
LEASE_SECONDS = 60  # renewed while held; how long a dead flow's slot stays taken


def limit_name() -> str:
    return os.environ.get("NIGHTSHIFT_GPU_LIMIT") or f"nightshift-gpu-{socket.gethostname()}"


def gpus_on_host() -> int:
    """The GPUs this host gives (``engines.devices``: an inherited CUDA_VISIBLE_DEVICES,
    else the driver's list). The slots only queue jobs; the device locks are what keep
    two engines off one GPU."""
    return len(given_devices() or [])


def host_takes_slots() -> bool:
    """Whether a job here holds GPU slots: a machine with GPUs, or one where
    NIGHTSHIFT_GPU_LIMIT names a limit (CPU engines share the cores)."""
    return bool(gpus_on_host() or os.environ.get("NIGHTSHIFT_GPU_LIMIT"))


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
    """Hold this job's share of the host's GPUs while the block runs. A machine without
    GPUs has nothing to guard (CPU engines share cores) unless NIGHTSHIFT_GPU_LIMIT
    names a limit."""
    if not host_takes_slots():
        yield
        return
    name, occupy = limit_name(), spec.engine.tensor_parallel_size
    ensure_limit(name, max(gpus_on_host(), occupy, 1))
    with ExitStack() as held:
        try:
            held.enter_context(_slot(name, occupy, timeout_seconds=1))
        except TimeoutError:
            log.warning(
                "waiting for the GPU: concurrency limit %s is full (another job runs, or "
                "one that died holds it until its lease ends, within %d s)",
                name,
                LEASE_SECONDS,
            )
            held.enter_context(_slot(name, occupy))
        yield


def try_gpu_slot(stack: ExitStack, spec: JobSpec) -> bool:
    """Take this job's GPU slots into ``stack`` if they are free now; False if another
    job holds them (the caller plans first, then waits with ``gpu_slot``)."""
    if not host_takes_slots():
        return True
    name, occupy = limit_name(), spec.engine.tensor_parallel_size
    ensure_limit(name, max(gpus_on_host(), occupy, 1))
    try:
        stack.enter_context(_slot(name, occupy, timeout_seconds=1))
    except TimeoutError:
        return False
    return True


@contextmanager
def _slot(name: str, occupy: int, timeout_seconds: float | None = None) -> Iterator[None]:
    held = concurrency(
        name,
        occupy,
        timeout_seconds=timeout_seconds,
        lease_duration=LEASE_SECONDS,
        strict=True,
    )
    held.__enter__()  # TimeoutError when the limit is full: nothing is held then
    try:
        yield
    finally:
        try:
            held.__exit__(None, None, None)  # the release only: the block's error stays
        except Exception:  # Prefect's server gone (the same SIGTERM stopped it): no error
            log.warning(
                "could not release the GPU slot; its lease frees it within %d s", LEASE_SECONDS
            )
