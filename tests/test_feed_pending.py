"""The feed's count of requests in flight per shard, updated from two threads: the
prefetch thread adds a batch's requests while the feeding thread takes answers back."""

from __future__ import annotations

import time
from collections import Counter

from nightshift.jobs.loading import validate_spec
from nightshift.running.feed import END, RequestFeed
from nightshift.running.runner import start_run
from nightshift.scheduling.plan import load_encoder

from .conftest import spec_dict, write_records

RECORDS = 1500


class SlowCounter(Counter):
    """A Counter whose read-modify-write leaves the other thread time to run between the
    read and the write, as a thread switch there would (free-threaded Python, or any
    switch the interpreter makes): without a lock one of two updates is lost."""

    def __setitem__(self, key, value):
        time.sleep(0.0005)
        super().__setitem__(key, value)


def test_no_update_of_the_in_flight_count_is_lost_between_the_two_threads(models, tmp_path):
    rows = [{"ticket_id": f"t{i}", "subject": f"s{i}", "body": f"b{i}"} for i in range(RECORDS)]
    write_records(tmp_path / "in" / "p.parquet", rows)
    data = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out")
    data["plan"] = {"shard_records": RECORDS}
    spec = validate_spec(data)
    job = start_run(spec, progress=False)
    [shard] = job.todo
    feed = RequestFeed(spec, job.output.plans, load_encoder(spec))
    feed._pending = SlowCounter()
    held = None
    try:
        feed.add(shard)
        feed.close_input()
        while (request := feed.next_request(wait=None)) is not END:
            if held is not None:
                feed.answered(held.key)  # answered while the next batches are encoded
            held = request
        assert not feed.stuck(shard)  # one request still out
        feed.answered(held.key)
        assert feed.stuck(shard) and not feed.in_flight
    finally:
        feed.close()
