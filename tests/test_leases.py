"""Shard leases on a local directory and on a real S3 server (SeaweedFS).

Time is a fake clock wherever expiry matters, so a test can stand right before or after
an expiry without sleeping; only the background renewal test uses the real clock.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from nightshift.errors import StoreError
from nightshift.io.leases import LeaseKeeper, ShardLeases, default_worker_id
from nightshift.io.objectstore import ObjectStore, open_store

pytest_plugins = ["tests.s3server"]


@pytest.fixture(autouse=True)
def prefect_server() -> None:
    """Leases never talk to Prefect: skip conftest's session server (20 s to start)."""


TTL = 60.0


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> ObjectStore:
    """A fresh, empty store: a temp directory, or a unique prefix in the test bucket."""
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    server = request.getfixturevalue("s3_env")
    return open_store(f"s3://{server.bucket}/t-{uuid.uuid4().hex[:12]}")


class FakeClock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def workers(store: ObjectStore, clock, *names: str, ttl_s: float = TTL) -> list[ShardLeases]:
    return [ShardLeases(store, name, ttl_s=ttl_s, clock=clock) for name in names]


def race(contenders: list[ShardLeases], shard: int) -> dict[str, object]:
    """Every contender claims ``shard`` at the same moment; their leases by worker."""
    barrier = threading.Barrier(len(contenders))

    def claim(leases: ShardLeases):
        barrier.wait()
        return leases.worker, leases.claim(shard)

    with ThreadPoolExecutor(len(contenders)) as pool:
        return dict(pool.map(claim, contenders))


def winner(results: dict[str, object]) -> str:
    won = [name for name, lease in results.items() if lease is not None]
    assert len(won) == 1, results
    return won[0]


# --- claiming ---------------------------------------------------------------------------


def test_two_workers_racing_for_a_shard_one_wins(store, clock):
    contenders = workers(store, clock, "left", "right")
    for shard in range(8):
        results = race(contenders, shard)
        name = winner(results)
        assert results[name].generation == 0
        assert store.list(f"leases/shard-{shard:05d}/") == [f"leases/shard-{shard:05d}/00000.json"]
        assert contenders[0].holder(shard)["worker"] == name


def test_lease_file_says_who_holds_it_until_when(store, clock):
    (a,) = workers(store, clock, "worker-a")
    lease = a.claim(7)
    assert lease.expires_at == clock() + TTL
    assert a.holder(7) == {
        "shard": 7,
        "generation": 0,
        "worker": "worker-a",
        "token": lease.token,
        "expires_at": clock() + TTL,
        "ttl_s": TTL,
        "released": False,
    }
    assert a.holder(8) is None


def test_a_live_lease_is_not_taken_over_even_right_before_expiry(store, clock):
    a, b = workers(store, clock, "a", "b")
    lease = a.claim(3)
    assert b.claim(3) is None
    clock.advance(TTL - 0.001)
    assert b.claim(3) is None
    clock.advance(0.001)  # exactly at expires_at: still live
    assert b.claim(3) is None
    assert a.still_held(lease)
    assert store.list("leases/") == ["leases/shard-00003/00000.json"]


def test_an_expired_lease_is_taken_over_and_the_old_holder_knows(store, clock):
    a, b = workers(store, clock, "a", "b")
    old = a.claim(3)
    clock.advance(TTL + 1)
    new = b.claim(3)
    assert (new.generation, b.holder(3)["worker"]) == (1, "b")
    assert store.list("leases/shard-00003/") == [
        "leases/shard-00003/00000.json",
        "leases/shard-00003/00001.json",
    ]
    assert not a.renew(old)
    assert not a.still_held(old)
    assert a.claim(3) is None  # b's lease is live
    assert b.still_held(new)
    assert b.renew(new)


def test_an_expired_lease_lost_even_if_nobody_took_it_yet(store, clock):
    """Renewing too late is refused: a taker may be creating the next generation now."""
    (a,) = workers(store, clock, "a")
    lease = a.claim(1)
    clock.advance(TTL + 1)
    assert not a.still_held(lease)
    assert not a.renew(lease)


def test_workers_racing_to_take_over_an_expired_lease_one_wins(store, clock):
    first, *takers = workers(store, clock, "first", "left", "right", "third")
    for shard in range(4):
        first.claim(shard)
    clock.advance(TTL + 1)
    for shard in range(4):
        results = race(takers, shard)
        name = winner(results)
        assert results[name].generation == 1
        assert first.holder(shard)["worker"] == name


def test_renewing_moves_expiry_past_the_old_one(store, clock):
    a, b = workers(store, clock, "a", "b")
    lease = a.claim(5)
    claimed_at = clock()
    clock.advance(TTL - 10)
    assert a.renew(lease)
    assert lease.expires_at == claimed_at + 2 * TTL - 10
    assert a.holder(5)["expires_at"] == lease.expires_at
    clock.advance(20)  # past the first expiry
    assert b.claim(5) is None
    assert a.still_held(lease)


def test_a_worker_restarted_under_its_id_gets_its_shard_back_at_once(store, clock):
    (before,) = workers(store, clock, "gpu-host-0")
    old = before.claim(2)
    (after,) = workers(store, clock, "gpu-host-0")
    new = after.claim(2)
    assert new.generation == 1
    assert not before.renew(old)
    assert after.still_held(new)


# --- giving up and clearing -------------------------------------------------------------


def test_release_lets_another_worker_claim_at_once(store, clock):
    a, b = workers(store, clock, "a", "b")
    lease = a.claim(4)
    a.release(lease)
    assert a.holder(4)["released"] is True
    assert a.holder(4)["expires_at"] == 0
    assert not a.still_held(lease)
    assert not a.renew(lease)
    taken = b.claim(4)
    assert taken.generation == 1
    a.release(lease)  # releasing a lost lease again does not touch b's
    assert b.still_held(taken)


def test_forget_deletes_only_that_shards_lease_files(store, clock):
    a, b = workers(store, clock, "a", "b")
    a.claim(4)
    clock.advance(TTL + 1)
    b.claim(4)
    b.claim(5)
    b.forget(4)
    assert store.list("leases/") == ["leases/shard-00005/00000.json"]
    assert b.holder(4) is None
    assert a.claim(4).generation == 0  # a forgotten shard starts over
    b.forget(9)  # never claimed: nothing to do


def test_store_errors_propagate_from_claim_and_renew(tmp_path, clock):
    store = FlakyStore(open_store(str(tmp_path / "s")))
    (a,) = workers(store, clock, "a")
    lease = a.claim(0)
    store.failing = True
    with pytest.raises(StoreError, match="injected"):
        a.claim(1)
    with pytest.raises(StoreError, match="injected"):
        a.renew(lease)


# --- renewing in the background ---------------------------------------------------------


def test_keeper_renews_so_a_short_lease_outlives_its_ttl(store):
    a, b = workers(store, time.time, "a", "b", ttl_s=0.4)
    lease = a.claim(0)
    first_expiry = lease.expires_at
    with LeaseKeeper(a, lease) as keeper:
        time.sleep(1.0)
        assert not keeper.lost.is_set()
        assert a.still_held(lease)
        assert b.claim(0) is None
    assert not keeper._thread.is_alive()
    assert lease.expires_at > first_expiry + 0.5


def test_keeper_sets_lost_when_a_newer_generation_appears(store, clock):
    (a,) = workers(store, clock, "a")
    lease = a.claim(0)
    with LeaseKeeper(a, lease, every_s=0.02) as keeper:
        time.sleep(0.1)
        assert not keeper.lost.is_set()
        # As if another worker had seen the lease expired on its own clock.
        takeover = {**a.holder(0), "generation": 1, "worker": "b", "token": "theirs"}
        assert store.put_if_absent("leases/shard-00000/00001.json", json.dumps(takeover).encode())
        assert keeper.lost.wait(2.0)
    assert not a.still_held(lease)


def test_keeper_sets_lost_when_the_lease_expired_and_was_taken(store, clock):
    a, b = workers(store, clock, "a", "b")
    lease = a.claim(0)
    with LeaseKeeper(a, lease, every_s=0.02) as keeper:
        clock.advance(TTL + 1)  # a's renewals stalled past expiry (a paused process, say)
        taken = b.claim(0)
        assert keeper.lost.wait(2.0)
    assert taken is not None
    assert b.still_held(taken)  # a's late renewal did not write over anything


def test_keeper_retries_store_errors_until_the_lease_would_expire(tmp_path, clock, caplog):
    store = FlakyStore(open_store(str(tmp_path / "s")))
    (a,) = workers(store, clock, "a")
    lease = a.claim(0)
    with LeaseKeeper(a, lease, every_s=0.02) as keeper:
        store.failing = True
        time.sleep(0.2)
        assert store.failures >= 3
        assert not keeper.lost.is_set()  # still well within the ttl: keep trying
        store.failing = False
        time.sleep(0.1)
        assert not keeper.lost.is_set()
        store.failing = True
        clock.advance(TTL - 0.01)  # the next retry would come after expiry
        assert keeper.lost.wait(2.0)
    assert "renewals failed until it expired" in caplog.text


def test_keeper_sets_lost_when_a_renewal_raises_something_else(store, clock, monkeypatch):
    (a,) = workers(store, clock, "a")
    lease = a.claim(0)
    monkeypatch.setattr(a, "renew", lambda lease: 1 / 0)
    with LeaseKeeper(a, lease, every_s=0.02) as keeper:
        assert keeper.lost.wait(2.0)


def test_default_worker_ids_differ():
    assert default_worker_id() != default_worker_id()


class FlakyStore:
    """A store whose requests fail with a StoreError while ``failing`` is set."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.failing = False
        self.failures = 0

    def __getattr__(self, name: str):
        method = getattr(self.inner, name)

        def call(*args, **kwargs):
            if self.failing:
                self.failures += 1
                raise StoreError(f"injected failure of {name}")
            return method(*args, **kwargs)

        return call
