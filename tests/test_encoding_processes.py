"""Prompts rendered and tokenized in processes beside the run (``running.encoding``):
the same ids in the same order as in a thread, a child that dies costs nothing, and a
child never outlives its run."""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from array import array
from types import SimpleNamespace

import polars as pl
import psutil
import pyarrow as pa
import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.io.outputs import JobOutput
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job
from nightshift.running import encoding, runner
from nightshift.running.encoding import LocalEncoding, ProcessEncoding, encode_processes
from nightshift.running.feed import RequestFeed
from nightshift.running.runner import start_run
from nightshift.running.shardqueue import ShardQueue
from nightshift.scheduling.plan import load_encoder

from .conftest import spec_dict, write_records
from .durable import assert_exactly_once

RECORDS = 1200


def tickets(folder, count=RECORDS):
    rows = [
        {"ticket_id": f"t{i}", "subject": f"Order {i} ñ 日本", "body": "can't log in " * (i % 7)}
        for i in range(count)
    ]
    return write_records(folder / "p.parquet", rows).parent


def wait_ready(encoding: ProcessEncoding, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(child.ready() for child in encoding._children):
        assert time.monotonic() < deadline, "the encoding process never got ready"
        time.sleep(0.1)


@pytest.fixture
def planned(models, tmp_path):
    data = spec_dict(models["chat"], tickets(tmp_path / "in"), tmp_path / "out")
    data["plan"] = {"shard_records": 500}
    spec = validate_spec(data)
    job = start_run(spec, progress=False)
    return spec, job


def feed_all(spec, job, processes: int, skip=None) -> list[tuple]:
    feed = RequestFeed(spec, job.output.plans, load_encoder(spec), processes=processes)
    try:
        out = []
        for request in feed.requests(job.todo, skip):
            pending = feed.in_flight[request.key]
            out.append((pending.shard, pending.record_id, request.token_ids))
        return out
    finally:
        feed.close()


def test_a_child_encodes_the_same_ids_as_the_thread(planned):
    spec, job = planned
    encoder = load_encoder(spec)
    local = LocalEncoding(spec, encoder)
    remote = ProcessEncoding(spec, encoder, processes=2)
    try:
        wait_ready(remote)
        batches = [b for s in job.todo for b in job.output.plans.shard_batches(s, 100)]
        frames = [pa.Table.from_batches([b]) for b in batches]
        sent = [remote.submit(f) for f in frames]  # all sent before any is read back
        assert [e() for e in sent] == [local.submit(f)() for f in frames]
    finally:
        remote.close()


def test_a_child_loads_the_runs_tokenizer_without_torch(planned):
    """The run's AutoTokenizer imported torch; a child loads the class it picked, and
    never maps torch's libraries (seconds of CPU and 0.3 GB a child)."""
    spec, _ = planned
    encoder = load_encoder(spec)
    assert "torch" in sys.modules  # the run's own load, through AutoTokenizer
    remote = ProcessEncoding(spec, encoder, processes=1)
    try:
        wait_ready(remote)
        maps = psutil.Process(remote._children[0].process.pid).memory_maps()
        # (libgomp may come from torch's folder: another library's OpenMP, not torch)
        assert maps and not [m.path for m in maps if "libtorch" in m.path]
    finally:
        remote.close()


@pytest.fixture
def through_children(monkeypatch) -> list:
    """Every batch through a child, none encoded locally while it starts; the list gets
    the ProcessEncoding of each batch."""
    submit, used = ProcessEncoding.submit, []

    def once_ready(self, records):
        wait_ready(self)
        used.append(self)
        return submit(self, records)

    monkeypatch.setattr(ProcessEncoding, "submit", once_ready)
    return used


def test_a_feed_with_processes_hands_out_what_a_thread_does(planned, through_children):
    spec, job = planned
    used = through_children
    first = [record for shard, record, _ in feed_all(spec, job, 0) if shard == job.todo[0]]
    skip = {job.todo[0]: set(first[::3])}  # checkpointed already
    alone = feed_all(spec, job, processes=0, skip=skip)
    assert len(alone) == RECORDS - len(first[::3])
    assert feed_all(spec, job, processes=2, skip=skip) == alone
    assert used and used[0].sent == len(used)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stuck"])
def test_a_child_that_dies_or_sticks_costs_no_batch(planned, how, monkeypatch):
    """A child killed, or frozen past ANSWER_WITHIN_S (then killed): its batches, the
    one it held included, are encoded in the run; the ids are the same."""
    monkeypatch.setattr(encoding, "ANSWER_WITHIN_S", 2.0)
    spec, job = planned
    encoder = load_encoder(spec)
    remote = ProcessEncoding(spec, encoder, processes=1)
    try:
        wait_ready(remote)
        batches = [b for s in job.todo for b in job.output.plans.shard_batches(s, 100)]
        frames = [pa.Table.from_batches([b]) for b in batches]
        os.kill(remote._children[0].process.pid, how)
        first = remote.submit(frames[0])  # sent before the run can know
        rest = [remote.submit(f) for f in frames[1:]]
        local = LocalEncoding(spec, encoder)
        assert [first(), *(e() for e in rest)] == [local.submit(f)() for f in frames]
        assert remote.sent >= 1
    finally:
        remote.close()


def test_a_child_still_starting_at_the_end_is_killed_not_waited_for(planned):
    """A short run (a rerun's last records) can end before its children have loaded
    their tokenizers: they were sent nothing, so the run ends without waiting for them."""
    spec, job = planned
    remote = ProcessEncoding(spec, load_encoder(spec), processes=1)
    [child] = remote._children
    assert not child.ready()  # just started: still importing
    remote.close()
    assert child.process.returncode == -signal.SIGKILL  # not its own exit once loaded
    assert remote.sent == 0


def test_a_killed_run_leaves_no_encoding_process(planned, tmp_path):
    """Also when a process forked from the run (as vLLM forks its engine core) still
    holds the run's end of the pipe: the child watches its parent too."""
    spec, _ = planned
    script = textwrap.dedent(
        f"""
        import time
        from nightshift.jobs.loading import validate_spec
        from nightshift.running.encoding import ProcessEncoding
        from nightshift.scheduling.plan import load_encoder
        spec = validate_spec({spec.model_dump(mode="json")!r})
        remote = ProcessEncoding(spec, load_encoder(spec), processes=1)
        while not remote._children[0].ready():
            time.sleep(0.05)
        import os
        holder = os.fork()
        if holder == 0:
            time.sleep(120)
            os._exit(0)
        print(remote._children[0].process.pid, holder, flush=True)
        time.sleep(600)
        """
    )
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child, holder = (int(pid) for pid in run.stdout.readline().split())
    try:
        assert psutil.pid_exists(child)
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        deadline = time.monotonic() + 30
        while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the encoding process outlived its run"
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, signal.SIGKILL)


def test_a_run_with_encoding_processes_answers_every_record_once(
    models, tmp_path, through_children
):
    """The fake engine answers from the prompt's ids: the same rows either way."""
    inputs = tickets(tmp_path / "in", 3000)
    results = {}
    for processes in (0, 1):
        out = tmp_path / f"out-{processes}"
        data = spec_dict(models["chat"], inputs, out, plan={"shard_records": 700})
        data["run"] = {"engine": "fake", "chunk_records": 256, "encode_processes": processes}
        run_job(validate_spec(data), progress=False)
        assert_exactly_once(str(out), "ticket_id", [f"t{i}" for i in range(3000)])
        results[processes] = (
            pl.read_parquet(f"{out}/results/*.parquet")
            .select("ticket_id", "label", "prompt_tokens")
            .sort("ticket_id")
        )
        assert JobOutput(str(out)).plans.manifest() is not None
    assert results[1].equals(results[0])
    assert through_children and through_children[-1].sent == len(through_children)


def test_how_many_processes_a_run_gets(monkeypatch):
    monkeypatch.delenv("NIGHTSHIFT_ENCODE_PROCESSES", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert encode_processes(1_000, None) == 0  # a small run: a thread is enough
    assert encode_processes(1_000_000, None) == 4
    assert encode_processes(1_000_000, 0) == 0
    assert encode_processes(10, 2) == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert encode_processes(1_000_000, None) == 1
    monkeypatch.setenv("NIGHTSHIFT_ENCODE_PROCESSES", "0")
    assert encode_processes(1_000_000, 3) == 0


def test_a_late_answer_after_a_time_out_is_never_taken_for_a_later_batch(monkeypatch):
    """The stuck child answers just after its time ran out: that answer (and any after
    it) is never read, every later batch of that child is encoded in the run."""
    monkeypatch.setattr(encoding, "ANSWER_WITHIN_S", 0.2)
    child = object.__new__(encoding._Child)
    child._answers, child._abandoned, child._state = queue.SimpleQueue(), False, "ready"
    child.process = SimpleNamespace(kill=lambda: None)
    child.local = SimpleNamespace(submit=lambda records: lambda: [["local", records]])

    def late():
        time.sleep(0.3)
        child._answers.put((array("i", [1]), array("i", [111])))  # batch N's, too late
        child._answers.put(encoding._GONE)

    threading.Thread(target=late).start()
    assert child._take("N") == [["local", "N"]]
    time.sleep(0.2)
    assert child._take("N+1") == [["local", "N+1"]]
    assert child._take("N+2") == [["local", "N+2"]]
    assert not child.ready()


def test_a_large_job_fed_a_shard_at_a_time_gets_its_processes(models, tmp_path, monkeypatch):
    """The job's size decides, not the shards open when the feed starts: a flow hands
    its shards over one by one, the first alone under the bar."""
    monkeypatch.setattr(encoding, "ENCODE_PROCESSES_FROM", 2000)
    monkeypatch.delenv("NIGHTSHIFT_ENCODE_PROCESSES", raising=False)
    data = spec_dict(models["chat"], tickets(tmp_path / "in", 3000), tmp_path / "out")
    data["plan"] = {"shard_records": 700}
    data["run"] = {"engine": "fake", "chunk_records": 256}
    job = start_run(validate_spec(data), progress=False)
    asked = []
    made = RequestFeed.__init__

    def recording(self, *args, **kwargs):
        made(self, *args, **kwargs)
        asked.append(self.processes)

    monkeypatch.setattr(RequestFeed, "__init__", recording)
    queue_ = ShardQueue()
    queue_.put(job.todo[0])  # the others come once the feed runs
    feeder = threading.Timer(1.0, lambda: [*map(queue_.put, job.todo[1:]), queue_.close()])
    feeder.start()
    engine = FakeEngine()
    job.runner.feed_shards(queue_, SimpleNamespace(acquire=lambda: engine, discard=print))
    feeder.join()
    assert asked == [1]
    assert_exactly_once(str(tmp_path / "out"), "ticket_id", [f"t{i}" for i in range(3000)])


def _spare_pids(spec) -> list[int]:
    return [child.process.pid for child in encoding._spares.get(pickle.dumps(spec), [])]


def _gone(pids: list[int], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_run_starts_its_encoding_processes_before_it_plans_and_its_feed_takes_them(
    models, tmp_path, monkeypatch
):
    """A child loads its tokenizer while the plan is built, not after the feed starts
    (seconds of batches encoded beside the engine), and is lent to the plan meanwhile;
    the feed takes those very children."""
    monkeypatch.setattr(encoding, "ENCODE_PROCESSES_FROM", 2000)
    monkeypatch.delenv("NIGHTSHIFT_ENCODE_PROCESSES", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    data = spec_dict(models["chat"], tickets(tmp_path / "in", 3000), tmp_path / "out")
    spec = validate_spec(data)
    started, build = [], runner.build_plan

    def planning(spec, encoder, progress, helpers):
        started.extend(c.process.pid for c in helpers.children)  # lent to the plan
        return build(spec, encoder, progress)

    monkeypatch.setattr(runner, "build_plan", planning)
    job = start_run(spec, progress=False)
    assert len(started) == 1
    taken = ProcessEncoding(spec, job.runner.encoder, processes=1)
    try:
        assert [c.process.pid for c in taken._children] == started
        assert _spare_pids(spec) == []
    finally:
        taken.close()
    assert _gone(started)


def test_encoding_processes_no_feed_takes_are_closed(models, tmp_path, monkeypatch):
    """A plan that fails closes them at once; a run that never feeds, after a while."""
    data = spec_dict(models["chat"], tickets(tmp_path / "in", 300), tmp_path / "out")
    data["run"] = {"encode_processes": 1}
    spec = validate_spec(data)
    failing = lambda *a, **k: (_ for _ in ()).throw(OSError("disk"))  # noqa: E731
    monkeypatch.setattr(runner, "build_plan", failing)
    seen = []
    monkeypatch.setattr(runner, "input_listing", lambda s: seen.extend(_spare_pids(s)) or "x")
    with pytest.raises(OSError, match="disk"):
        start_run(spec, progress=False)
    assert len(seen) == 1 and _gone(seen) and _spare_pids(spec) == []
    monkeypatch.setattr(encoding, "SPARE_FOR_S", 0.5)
    encoding.start_spare(spec, load_encoder(spec), 300)
    unclaimed = _spare_pids(spec)
    assert len(unclaimed) == 1 and _gone(unclaimed) and _spare_pids(spec) == []
