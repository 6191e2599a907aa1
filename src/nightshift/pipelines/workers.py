"""Scale-out: many workers, one engine each, claiming shards through leases.

A worker is a Prefect flow run (``nightshift-worker``) that owns one engine (one GPU, or
``engine.tensor_parallel_size`` GPUs) for its whole life and loops: claim the next
uncommitted shard whose lease is free or expired (``io.leases``), run it as a shard task,
commit, claim the next. It holds ``SHARDS_AHEAD`` shards at a time and feeds them to its
engine through one feeding loop (``running.feeding``), so the next shard's records are in
the batch before the current one commits. Workers never talk to each other; the object
store is the only shared state, so they may run anywhere that reaches the output: N processes on one
machine (``jobs run --workers N``), or N flow runs of a deployment on a Kubernetes or
other work pool, one pod per GPU (see docs/scale-out.md).

A worker that dies stops renewing its lease; once it expires (``run.lease_s``) another
worker takes the shard over and continues from its checkpoints. The commit marker, a
conditional create, keeps a shard from being committed twice whatever the timing.
A worker that is stopped (SIGTERM, Ctrl-C, a Prefect cancellation: ``pipelines.stops``)
claims nothing more, checkpoints what it holds and releases its leases, so another
worker takes its shards over at once instead of after the lease expires.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prefect import flow
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run

from nightshift.errors import LeaseLostError, RunStoppedError, ShardAttemptFailed
from nightshift.io.leases import Lease, LeaseKeeper, ShardLeases
from nightshift.jobs.loading import load_spec
from nightshift.pipelines.canary import check_canary
from nightshift.pipelines.direct import run_job
from nightshift.pipelines.flow import running_job_name, shard_task_for
from nightshift.pipelines.slots import gpu_slot
from nightshift.pipelines.stops import cancelled_state, graceful_stop
from nightshift.running.encoding import close_spare
from nightshift.running.engines import EnginePool, check_engine_spec
from nightshift.running.feeding import FeedingLoop
from nightshift.running.runner import JobRun, start_run
from nightshift.running.workerstats import write_worker_figures

log = logging.getLogger(__name__)
IDLE_POLL_S = 2.0  # how often a worker with nothing to claim looks again
BUSY_POLL_S = 0.2  # how often a worker with shards running looks at them
SHARDS_AHEAD = 2  # shards a worker holds at once: one generating, the next queued


@dataclass
class Claimed:
    """A shard this worker holds: its lease, the thread renewing it, its shard task."""

    lease: Lease
    keeper: LeaseKeeper
    future: PrefectFuture


def _worker_run_name() -> str:
    return f"{running_job_name()}-{flow_run.parameters['worker']}-{datetime.now():%H%M%S}"


@flow(name="nightshift-worker", flow_run_name=_worker_run_name, validate_parameters=True)
def worker_flow(spec_path: str, worker: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Claim and run this job's shards until every one is committed (or failed here)."""
    spec = load_spec(spec_path, overrides)
    check_engine_spec(spec)
    with graceful_stop(spec.run.stop_s, flow_run.get_id()) as stop:
        job = start_run(spec, progress=False, retry_in_place=False, as_worker=True)
        worker_id = f"{worker}-{uuid.uuid4().hex[:6]}"
        leases = ShardLeases(job.output.store, worker_id, ttl_s=spec.run.lease_s)
        engines = EnginePool(spec)
        feeding = FeedingLoop(job.runner, engines)
        stop.on_stop(lambda: feeding.request_stop(f"the worker was stopped ({stop.why})"))
        stop.on_kill(engines.kill)
        try:
            with gpu_slot(spec):
                # the canary: measured by the first worker (a lease), waited for by the
                # others, judged under this worker's run.canary keys: none claimed below it
                check_canary(job, engines, run_job, stop.requested)
                done = claim_and_run(job, feeding, leases, stop.requested)
        finally:
            feeding.close()
            engines.close()
            close_spare(spec)  # encoding processes no feed took
        job.progress.close(job.runner.totals)
        write_worker_figures(job, engines, worker_id)
        result = {"worker": worker_id, "shards": done}
        if stop.requested.is_set():
            stop.report = {**result, "stopped": stop.describe(job.progress.started)}
            return cancelled_state(stop)
    return result


def claim_and_run(
    job: JobRun,
    feeding: FeedingLoop,
    leases: ShardLeases,
    stopping: threading.Event | None = None,
) -> list[int]:
    """The worker loop: the shards this worker committed, in order. Once ``stopping``
    is set it claims nothing more and returns when the shards it holds have settled.

    Each shard's marker is read on its own, and a shard seen committed is never looked
    at again: a worker costs the store a few reads per shard, not a read of every
    marker per shard (on S3, millions of GETs for a few thousand shards)."""
    settled: set[int] = set()  # committed (here or elsewhere), or given up here
    held: dict[int, Claimed] = {}
    done: list[int] = []
    while True:
        for shard in [s for s, c in held.items() if c.future.state.is_final()]:
            if _settle(leases, held.pop(shard), job):
                done.append(shard)
            settled.add(shard)
        left = [s for s in job.todo if s not in settled and s not in held]
        if stopping is not None and stopping.is_set():
            left = []  # claim nothing more
        if not left and not held:
            return done
        if left and len(held) < SHARDS_AHEAD:
            lease = _claim_first(job, leases, left, settled)
            if lease is not None:
                _hold(job, feeding, leases, lease, held, settled)
                continue
        time.sleep(BUSY_POLL_S if held else IDLE_POLL_S)  # live workers lease the rest


def _claim_first(
    job: JobRun, leases: ShardLeases, shards: list[int], settled: set[int]
) -> Lease | None:
    """Claim the first free uncommitted shard (plan order: the longest prompts first);
    the committed ones met on the way join ``settled``."""
    for shard in shards:
        if job.output.shards.marker(shard) is not None:
            settled.add(shard)
            continue
        lease = leases.claim(shard)
        if lease is not None:
            return lease
    return None


def _hold(
    job: JobRun,
    feeding: FeedingLoop,
    leases: ShardLeases,
    lease: Lease,
    held: dict[int, Claimed],
    settled: set[int],
) -> None:
    """Start a claimed shard's task on the feeding loop, its lease renewed meanwhile."""
    shard = lease.shard
    if job.output.shards.marker(shard) is not None:  # committed just before the claim
        leases.forget(shard)
        settled.add(shard)
        return
    keeper = LeaseKeeper(leases, lease).__enter__()
    job.runner.lease_lost[shard] = keeper.lost
    feeding.expect([shard])  # fed in the order claimed (the plan's), not as tasks start
    future = shard_task_for(job.spec).submit(shard, feeding)
    held[shard] = Claimed(lease, keeper, future)


def _settle(leases: ShardLeases, claimed: Claimed, job: JobRun) -> bool:
    """A held shard's task ended; True when it committed here. A shard whose attempts
    ran out here is released for other workers; one taken over by another is left to it."""
    shard = claimed.lease.shard
    claimed.keeper.__exit__(None, None, None)
    job.runner.lease_lost.pop(shard, None)
    if claimed.future.state.is_completed():
        leases.forget(shard)
        return True
    error = claimed.future.result(raise_on_failure=False)
    if isinstance(error, LeaseLostError):
        log.warning("shard %d was taken over by another worker; moving on", shard)
    elif isinstance(error, ShardAttemptFailed | RunStoppedError):
        leases.release(claimed.lease)  # another worker may take it over at once
    else:
        raise error
    return False
