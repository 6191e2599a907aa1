"""Scale-out: many workers, one engine each, claiming shards through leases.

A worker is a Prefect flow run (``nightshift-worker``) that owns one engine (one GPU, or
``engine.tensor_parallel_size`` GPUs) for its whole life and loops: claim the next
uncommitted shard whose lease is free or expired (``io.leases``), run it as a shard task,
commit, claim the next. Workers never talk to each other; the object store is the only
shared state, so they may run anywhere that reaches the output: N processes on one
machine (``jobs run --workers N``), or N flow runs of a deployment on a Kubernetes or
other work pool, one pod per GPU (see the README, "Scale-out").

A worker that dies stops renewing its lease; once it expires (``run.lease_s``) another
worker takes the shard over and continues from its checkpoints. The commit marker, a
conditional create, keeps a shard from being committed twice whatever the timing.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from nightshift.errors import LeaseLostError, ShardAttemptFailed
from nightshift.io.leases import Lease, LeaseKeeper, ShardLeases
from nightshift.jobs.loading import load_spec
from nightshift.pipelines.flow import running_job_name, shard_task_for
from nightshift.pipelines.slots import gpu_slot
from nightshift.running.engines import EnginePool, check_engine_spec
from nightshift.running.runner import JobRun, start_run
from nightshift.running.workerstats import write_worker_figures

log = logging.getLogger(__name__)
IDLE_POLL_S = 2.0  # how often a worker with nothing to claim looks again


def _worker_run_name() -> str:
    return f"{running_job_name()}-{flow_run.parameters['worker']}-{datetime.now():%H%M%S}"


@flow(name="nightshift-worker", flow_run_name=_worker_run_name, validate_parameters=True)
def worker_flow(spec_path: str, worker: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """Claim and run this job's shards until every one is committed (or failed here)."""
    spec = load_spec(spec_path, overrides)
    check_engine_spec(spec)
    job = start_run(spec, progress=False, retry_in_place=False, as_worker=True)
    worker_id = f"{worker}-{uuid.uuid4().hex[:6]}"
    leases = ShardLeases(job.output.store, worker_id, ttl_s=spec.run.lease_s)
    engines = EnginePool(spec)
    try:
        with gpu_slot(spec):
            done = claim_and_run(job, engines, leases)
    finally:
        engines.close()
    job.progress.close(job.runner.totals)
    write_worker_figures(job, engines, worker_id)
    return {"worker": worker_id, "shards": done}


def claim_and_run(job: JobRun, engines: EnginePool, leases: ShardLeases) -> list[int]:
    """The worker loop: the shards this worker committed, in order.

    Each shard's marker is read on its own, and a shard seen committed is never looked
    at again: a worker costs the store a few reads per shard, not a read of every
    marker per shard (on S3, millions of GETs for a few thousand shards)."""
    settled: set[int] = set()  # committed (here or elsewhere), or given up here
    done: list[int] = []
    while True:
        left = [s for s in job.todo if s not in settled]
        if not left:
            return done
        lease = _claim_first(job, leases, left, settled)
        if lease is None:
            if any(s not in settled for s in left):  # leased by live workers: one may die
                time.sleep(IDLE_POLL_S)
            continue
        if _run_claimed(job, engines, leases, lease):
            done.append(lease.shard)
        settled.add(lease.shard)


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


def _run_claimed(job: JobRun, engines: EnginePool, leases: ShardLeases, lease: Lease) -> bool:
    """Run a claimed shard; True when it committed here. A shard whose attempts ran out
    here is released for other workers; one taken over by another worker is left to it."""
    shard = lease.shard
    if job.output.shards.marker(shard) is not None:  # committed just before the claim
        leases.forget(shard)
        return False
    with LeaseKeeper(leases, lease) as keeper:
        job.runner.lease_lost = keeper.lost
        try:
            shard_task_for(job.spec)(job, shard, engines)
        except LeaseLostError:
            log.warning("shard %d was taken over by another worker; moving on", shard)
            return False
        except ShardAttemptFailed:
            leases.release(lease)
            return False
        finally:
            job.runner.lease_lost = None
    leases.forget(shard)
    return True
