"""The feeding loop's order: shards reach the engine in the plan's order, whatever order
their Prefect tasks start in, and one after another without a break."""

from __future__ import annotations

import threading
import time

import pytest

from nightshift.engines.fake import FakeEngine, prompt_digest
from nightshift.io.objectstore import open_store
from nightshift.io.planstore import PlanStore
from nightshift.jobs.loading import load_spec
from nightshift.pipelines.flow import SHARDS_AHEAD, job_flow
from nightshift.running import shardqueue
from nightshift.running.copies import CopyBook
from nightshift.running.feed import RequestFeed
from nightshift.running.shardqueue import ShardQueue
from nightshift.scheduling.plan import load_encoder

from .conftest import spec_dict


def test_shards_arriving_out_of_order_are_handed_out_in_the_announced_order():
    queue = ShardQueue()
    queue.expect([0, 1, 2, 3])
    for shard in (3, 1):
        queue.put(shard)
    assert queue.take() is None  # 0 is announced first and has not come yet
    queue.put(0)
    assert [queue.take(), queue.take()] == [0, 1]
    queue.put(2)
    assert [queue.take(), queue.take(), queue.take()] == [2, 3, None]


def test_a_blocking_take_waits_for_the_shard_whose_turn_it_is():
    queue = ShardQueue()
    queue.expect([0, 1])
    queue.put(1)
    threading.Timer(0.2, queue.put, args=(0,)).start()
    assert queue.take(wait=None) == 0


def test_a_shard_announced_but_never_put_holds_the_others_back_only_briefly(monkeypatch):
    monkeypatch.setattr(shardqueue, "HOLD_S", 0.3)
    queue = ShardQueue()
    queue.expect([0, 1, 2])
    queue.put(2)
    queue.put(1)
    began = time.monotonic()
    assert queue.take(wait=None) == 1  # 0 never came
    assert 0.3 <= time.monotonic() - began < 2
    assert queue.take() == 2  # no second wait for 0
    queue.put(0)  # late after all: it still runs
    assert queue.take() == 0


def test_a_retried_shard_and_one_put_back_go_first_and_a_closed_queue_holds_nothing():
    queue = ShardQueue()
    queue.expect([0, 1, 2])
    queue.put(0)
    assert queue.take() == 0
    queue.put(2)
    queue.put(0)  # its task's retry: it was taken before
    assert queue.take() == 0
    queue.put(1, front=True)  # after an engine death
    assert queue.take() == 1
    queue.expect([5])
    queue.put(4)
    queue.close()  # nothing more comes: 4 waits for nobody
    assert [queue.take(wait=None), queue.take(wait=None)] == [2, 4]
    assert queue.take(wait=None) is None and queue.finished


def test_without_announcements_shards_go_in_the_order_they_came():
    queue = ShardQueue([5, 2, 7], closed=True)
    assert [queue.take(), queue.take(), queue.take(), queue.take()] == [5, 2, 7, None]


def planned_prompts(spec_path) -> list[list[str]]:
    """Each shard's prompts as the plan runs them (digests), shard by shard, without the
    repeats that are answered from their first copy."""
    spec = load_spec(spec_path)
    plans = PlanStore(open_store(spec.output.path))
    manifest = plans.manifest()
    copies = CopyBook.load(plans, manifest)
    prompts = []
    for shard in range(len(manifest["shards"]["each"])):
        feed = RequestFeed(spec, plans, load_encoder(spec))
        try:
            skip = {shard: copies.ids(shard)}
            prompts.append([prompt_digest(r.token_ids) for r in feed.requests([shard], skip)])
        finally:
            feed.close()
    return prompts


def test_the_flow_feeds_the_shards_in_plan_order_without_a_break(
    models, ticket_dir, tmp_path, write_spec, monkeypatch
):
    """Eleven shards through the flow (four shard tasks at a time, starting in a race): the
    fake engine receives every shard's prompts in the plan's order, and its windows of
    eight are full across each shard boundary (the next shard was fed before the one
    before it was answered)."""
    windows: list[list[str]] = []
    take_window, run, put = FakeEngine._take_window, FakeEngine.run, ShardQueue.put
    queued: list[int] = []
    first_tasks_queued = threading.Event()

    def recorded(self, pending):
        window, exhausted = take_window(self, pending)
        windows.append([prompt_digest(r.token_ids) for r in window])
        return window, exhausted

    def recorded_put(self, shard, front=False):
        put(self, shard, front)
        queued.append(shard)
        if len(queued) >= SHARDS_AHEAD:
            first_tasks_queued.set()

    def run_once_first_tasks_queued(self, requests, sampling):
        # The first tasks start in a race, and a shard queued after the engine's first
        # requests joins the feed only after a step: on a loaded machine that step was
        # short. What is tested is the feed running ahead of the engine across shard
        # boundaries, once shards are there to feed.
        first_tasks_queued.wait(timeout=60)
        yield from run(self, requests, sampling)

    monkeypatch.setattr(FakeEngine, "_take_window", recorded)
    monkeypatch.setattr(FakeEngine, "run", run_once_first_tasks_queued)
    monkeypatch.setattr(ShardQueue, "put", recorded_put)
    # A slower engine than the feed: a short window can only come from a gap.
    monkeypatch.setenv("NIGHTSHIFT_FAKE_SECONDS_PER_RECORD", "0.02")
    data = spec_dict(models["chat"], ticket_dir, tmp_path / "out", plan={"shard_records": 12})
    data["run"] = {"engine": "fake", "chunk_records": 5}
    spec_path = write_spec(data)

    report = job_flow(spec_path=str(spec_path))

    assert report["shards"]["committed"] == report["shards"]["count"] == 11
    planned = planned_prompts(spec_path)
    fed = [digest for window in windows for digest in window]
    assert fed == [digest for shard in planned for digest in shard]
    assert [len(w) for w in windows[:-1]] == [8] * (len(windows) - 1)


class StubRunner:
    """What FeedingLoop reads of a ShardRunner besides ``feed_shards``."""

    on_settled = None
    failures: dict = {}
    stopped: set = set()
    lost: set = set()


@pytest.mark.parametrize("order", [[2, 0, 1], [1, 2, 0]])
def test_shards_submitted_in_any_order_are_fed_in_the_announced_one(order):
    from nightshift.running.feeding import FeedingLoop

    taken: list[int] = []

    class Runner(StubRunner):
        def feed_shards(self, queue, engines):
            while (shard := queue.take(wait=None)) is not None:
                taken.append(shard)
                self.on_settled(shard)

    loop = FeedingLoop(Runner(), engines=None)
    loop.expect([0, 1, 2])
    futures = [loop.submit(shard) for shard in order]
    assert sorted(f.result(timeout=10) for f in futures) == [0, 1, 2]
    loop.close()
    assert taken == [0, 1, 2]


@pytest.mark.parametrize("fails", [False, True])
def test_what_exists_when_the_feed_starts_is_out_of_the_collector_s_sight_until_it_ends(fails):
    """The cycle collector's full passes skip the objects alive when feeding starts (they
    walked them all again every 15-20 s at a million records); they are let back in when
    the feed ends, however it ends."""
    import gc

    from nightshift.running.feeding import FeedingLoop

    frozen: list[int] = []

    class Runner(StubRunner):
        def feed_shards(self, queue, engines):
            frozen.append(gc.get_freeze_count())
            while (shard := queue.take(wait=None)) is not None:
                if fails:
                    raise RuntimeError("the engine died")
                self.on_settled(shard)

    assert gc.get_freeze_count() == 0
    loop = FeedingLoop(Runner(), engines=None)
    loop.expect([0])
    future = loop.submit(0)
    if fails:
        with pytest.raises(RuntimeError):
            future.result(timeout=10)
    else:
        assert future.result(timeout=10) == 0
    loop.close()
    assert frozen and frozen[0] > 1000  # imports alone are many thousands of objects
    assert gc.get_freeze_count() == 0


def test_the_collector_runs_less_while_any_feed_runs_and_as_before_after_the_last():
    """A young collection every 20,000 containers, not 700, while feeds run (a record
    makes a dozen); the threshold before is back once the last of two overlapping
    feeds ends, whichever ends first."""
    import gc

    from nightshift.running.feeding import FEEDING_GC_THRESHOLD, collector_skips_what_exists

    before = gc.get_threshold()
    assert before != FEEDING_GC_THRESHOLD
    first, second = collector_skips_what_exists(), collector_skips_what_exists()
    first.__enter__()
    assert gc.get_threshold() == FEEDING_GC_THRESHOLD
    second.__enter__()
    first.__exit__(None, None, None)  # the first ends while the second still feeds
    assert gc.get_threshold() == FEEDING_GC_THRESHOLD
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), collector_skips_what_exists():
        raise RuntimeError("the engine died")
    assert gc.get_threshold() == before
