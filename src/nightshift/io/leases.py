"""Shard leases: one worker generates a shard at a time, and a dead worker's shard moves on.

When several workers (processes, perhaps on different machines) run the shards of one
job into one output, each claims a shard before generating it. A lease expires unless
its holder renews it, so a worker that dies blocks its shard for one ``ttl_s`` at most;
then another worker takes the shard over and continues from its checkpoints.

Leases only avoid double work. The output is correct without them: a shard's commit
marker is created only if absent, so of two attempts exactly one counts.

Layout under the output (local directory or S3 prefix)::

    leases/shard-00007/00000.json    generation 0: the first claim of shard 7
    leases/shard-00007/00001.json    generation 1: a takeover after 0 expired or was released

Each file holds ``{"shard", "generation", "worker", "token", "expires_at", "ttl_s",
"released"}``. The shard's lease is its highest generation. The protocol needs nothing
but ``put_if_absent`` (one winner among racing creators, on any store), no compare-and-swap:

* Claim: read the newest generation N. If there is none, create generation 0; if N has
  expired or was released, create N + 1. Of several workers racing, exactly one creates
  the file and holds the shard; the others get ``None``. A live lease of another worker
  is never taken.
* Renew: only the holder writes its own generation after creating it. It rewrites the
  file with a later ``expires_at``, then lists the shard's generations: a newer one means
  another worker took over after an expiry, and the holder must stop work on the shard.
  ``LeaseKeeper`` renews every ``ttl_s / 4`` in a background thread.
* Release: the holder marks its file released (``expires_at`` 0) when it gives a shard up
  without committing it, so another worker can claim it at once. After a commit,
  ``forget`` deletes the shard's lease files (best effort; leftovers are harmless).

Clocks: ``expires_at`` is wall-clock epoch seconds written by one machine and compared by
another, so workers' clocks must agree within a few seconds (NTP), and ``ttl_s`` must be
much larger than that skew (the default 120 s is). ``grace_s`` widens the margin a
claimer allows before it treats a lease as expired.

Worker ids must be unique among running workers. A live lease whose ``worker`` is our own
id is taken over at once (a new generation): a worker restarted under the same id gets
its shards back without waiting for them to expire.

Claim a shard first, then check its commit marker: a shard committed (and forgotten) by
another worker just before the claim is then still seen as done.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from nightshift.errors import ObjectNotFound, StoreError, UserError
from nightshift.io.objectstore import ObjectStore
from nightshift.io.shardstore import shard_name

log = logging.getLogger(__name__)

LEASES = "leases"
GENERATION_FILE = re.compile(r"^(\d+)\.json$")
VANISHED_RETRIES = 3  # a generation listed but deleted (by forget) before it was read
# A worker id names files in the output (_work/workers/<id>.json): no "/", no "..".
WORKER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class Lease:
    """One worker's claim of a shard. ``renew`` moves ``expires_at`` forward in place."""

    shard: int
    generation: int
    token: str
    expires_at: float


def check_worker_id(worker: str, most: int = 100) -> str:
    """``worker``, if it can name a worker's files; else a ``UserError`` saying why. The
    worker flow adds a suffix to the name given, so a full id may be longer."""
    if not WORKER_ID.match(worker) or ".." in worker or len(worker) > most:
        raise UserError(
            f"--worker: {worker!r} cannot name a worker (it names files in the output); "
            f"use up to {most} letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return worker


def default_worker_id() -> str:
    """Host and process, plus a random part: unique among workers, readable in status."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ShardLeases:
    """Claim, renew and release shard leases in one output, as worker ``worker``."""

    def __init__(
        self,
        store: ObjectStore,
        worker: str,
        ttl_s: float = 120.0,
        clock: Callable[[], float] = time.time,
        grace_s: float = 0.0,
    ) -> None:
        if not 0 < ttl_s < float("inf"):
            raise ValueError(f"ttl_s must be positive and finite, got {ttl_s}")
        self.store = store
        self.worker = check_worker_id(worker, most=200)
        self.ttl_s = ttl_s
        self.clock = clock
        self.grace_s = grace_s

    def claim(self, shard: int) -> Lease | None:
        """The shard's lease if this worker now holds it; None if another worker does."""
        newest = self.holder(shard)
        if newest is None:
            generation = 0
        elif self._claimable(newest):
            generation = newest["generation"] + 1
        else:
            return None
        lease = Lease(shard, generation, uuid.uuid4().hex, self.clock() + self.ttl_s)
        if not self.store.put_if_absent(self._key(shard, generation), self._body(lease)):
            return None  # another worker created this generation first
        return lease

    def renew(self, lease: Lease) -> bool:
        """Extend the lease by ``ttl_s``. False: it is lost, stop working on the shard."""
        now = self.clock()
        if now > lease.expires_at or not self._ours(lease, self._read(lease)):
            return False  # expired (a taker may be creating N + 1 now), released or gone
        renewed = Lease(lease.shard, lease.generation, lease.token, now + self.ttl_s)
        self.store.put_bytes(self._key(lease.shard, lease.generation), self._body(renewed))
        if self._newest_generation(lease.shard) != lease.generation:
            return False  # another worker took over after an expiry
        lease.expires_at = renewed.expires_at
        return True

    def still_held(self, lease: Lease) -> bool:
        """Whether the lease is still this claim's: newest, our token, live."""
        if self._newest_generation(lease.shard) != lease.generation:
            return False
        body = self._read(lease)
        return self._ours(lease, body) and self.clock() <= body["expires_at"]

    def release(self, lease: Lease) -> None:
        """Give the shard up uncommitted, so another worker may claim it at once."""
        if not self._ours(lease, self._read(lease)):
            return  # no longer ours: nothing of ours to give up
        released = Lease(lease.shard, lease.generation, lease.token, 0.0)
        self.store.put_bytes(self._key(lease.shard, lease.generation), self._body(released, True))
        lease.expires_at = 0.0

    def forget(self, shard: int) -> None:
        """Delete all the shard's lease files: after it commits, they serve no one."""
        self.store.delete(self.store.list(self._prefix(shard)))

    def holder(self, shard: int) -> dict[str, Any] | None:
        """The newest lease body of the shard (for status), or None if never claimed."""
        for _ in range(VANISHED_RETRIES):
            generation = self._newest_generation(shard)
            if generation is None:
                return None
            try:
                return json.loads(self.store.get_bytes(self._key(shard, generation)))
            except ObjectNotFound:
                continue  # forgotten between the listing and the read: list again
        return None  # still vanishing: the shard committed and is being forgotten

    def _claimable(self, body: dict[str, Any]) -> bool:
        """Released, expired (with grace for clock skew), or our own id's earlier claim."""
        expired = body["expires_at"] + self.grace_s < self.clock()
        return body.get("released", False) or expired or body["worker"] == self.worker

    def _ours(self, lease: Lease, body: dict[str, Any] | None) -> bool:
        return body is not None and body["token"] == lease.token and not body.get("released")

    def _read(self, lease: Lease) -> dict[str, Any] | None:
        try:
            return json.loads(self.store.get_bytes(self._key(lease.shard, lease.generation)))
        except ObjectNotFound:
            return None

    def _newest_generation(self, shard: int) -> int | None:
        prefix = self._prefix(shard)
        names = (key.removeprefix(prefix) for key in self.store.list(prefix))
        generations = [int(m.group(1)) for m in map(GENERATION_FILE.match, names) if m]
        return max(generations, default=None)

    def _body(self, lease: Lease, released: bool = False) -> bytes:
        body = {**asdict(lease), "worker": self.worker, "ttl_s": self.ttl_s}
        return json.dumps({**body, "released": released}, sort_keys=True).encode()

    def _prefix(self, shard: int) -> str:
        return f"{LEASES}/{shard_name(shard)}/"

    def _key(self, shard: int, generation: int) -> str:
        return f"{self._prefix(shard)}{generation:05d}.json"


class LeaseKeeper:
    """Renews a lease in the background while a worker generates its shard.

    Check ``lost.is_set()`` before each checkpoint and commit: it is set when a renewal
    finds another worker took over, or when renewals kept failing (store errors) until
    the lease expired. Leaving the ``with`` block stops the thread; it neither releases
    nor forgets the lease (the caller knows whether the shard committed).
    """

    def __init__(self, leases: ShardLeases, lease: Lease, every_s: float | None = None):
        self.leases = leases
        self.lease = lease
        self.every_s = every_s if every_s is not None else leases.ttl_s / 4
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"lease-{shard_name(lease.shard)}", daemon=True
        )

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if not self._renew_once():
                self.lost.set()
                return

    def _renew_once(self) -> bool:
        """One renewal. A store error is retried at the next tick if the lease is still
        live then; otherwise the lease is as good as lost and the worker must stop."""
        shard = shard_name(self.lease.shard)
        try:
            if self.leases.renew(self.lease):
                return True
            why = "it expired" if self._expired_by(0.0) else "another worker took it over"
            log.warning("lease of %s lost: %s", shard, why)
            return False
        except StoreError as exc:
            if self._expired_by(self.every_s):
                log.warning("lease of %s lost: renewals failed until it expired", shard)
                return False
            log.warning("renewing the lease of %s failed, will retry: %s", shard, exc)
            return True
        except Exception:  # a bug: say the lease is lost rather than let the thread die
            log.exception("renewing the lease of %s failed", shard)
            return False

    def _expired_by(self, delay_s: float) -> bool:
        return self.leases.clock() + delay_s > self.lease.expires_at
