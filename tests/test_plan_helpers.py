"""A first plan built with helpers beside it (``scheduling.helpers``): the same plan as
one built alone, whichever helper runs which job, in whatever order the answers come
back, and whether a helper is busy, fails or dies."""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import polars as pl
import pytest
import yaml

from nightshift.jobs.loading import validate_spec
from nightshift.running import encoding
from nightshift.scheduling import firstpass
from nightshift.scheduling.chunkkeys import ChunkKeys
from nightshift.scheduling.helpers import InOrder
from nightshift.scheduling.known import KnownIds
from nightshift.scheduling.measure import RecordMeasurer
from nightshift.scheduling.plan import block_size, build_plan, load_encoder, open_job_input

from .conftest import spec_dict, write_records


def awkward_tickets(folder, count: int = 1500):
    """Tickets with everything a plan sets apart or merges: null ids and subjects, an id
    twice, exact repeats, and long shared starts under short ones, in two files."""
    rows = []
    for i in range(count):
        body = ("The export page shows an error after the update. " * (i % 9)) + f"case {i % 40}"
        rows.append({"ticket_id": f"t{i}", "subject": f"Order {i % 13} ñ", "body": body})
    rows[7]["ticket_id"] = None
    rows[11]["subject"] = None
    rows[500]["ticket_id"] = "t3"  # an id twice: the second is set apart
    for k in range(20, 60):  # exact repeats of record 20: answered once
        rows[k] = {**rows[20], "ticket_id": f"copy{k}"}
    write_records(folder / "a.parquet", rows[: count // 3])
    write_records(folder / "b.parquet", rows[count // 3 :])
    return folder


@pytest.fixture
def spec(models, tmp_path, monkeypatch):
    monkeypatch.setattr(firstpass, "READ_BATCH", 256)  # many slices, some in each helper
    monkeypatch.setattr(firstpass, "MEASURE_BATCH", 64)
    data = spec_dict(models["chat"], awkward_tickets(tmp_path / "in"), tmp_path / "out")
    data["plan"] = {"shard_records": 300}
    data["run"] = {"encode_processes": 1}
    data["model"]["max_model_len"] = 120  # long tickets are counted exactly, some rejected
    return validate_spec(data)


def assert_same_plan(alone, helped) -> None:
    assert helped.records.equals(alone.records)
    assert helped.rejects.equals(alone.rejects)
    assert helped.input_records == alone.input_records
    assert helped.exact_records == alone.exact_records
    assert helped.prefix_reuse == alone.prefix_reuse
    assert helped.shard_adapters == alone.shard_adapters


class ThreadHelpers:
    """Helpers in threads of this process, each with its own encoder and measurer, as a
    child has: slices finish out of order; some are refused (busy), some fail."""

    def __init__(self, spec, count: int = 2, refuse_every: int = 4, fail_every: int = 5):
        self.spec, self.count = spec, count
        self.refuse_every, self.fail_every = refuse_every, fail_every
        self.pool = ThreadPoolExecutor(count)
        self.own = threading.local()
        self.offered = self.measured = 0
        self.kinds: set[str] = set()
        self.random = random.Random(5)

    def submit(self, job):
        self.offered += 1
        self.kinds.add(type(job).__name__)
        if self.refuse_every and self.offered % self.refuse_every == 0:
            return None  # busy: the plan runs it itself
        fails = bool(self.fail_every) and self.offered % self.fail_every == 0
        delay = self.random.random() / 50
        return Measured(self.pool.submit(self._run, job, delay, fails))

    def _run(self, job, delay, fails):
        time.sleep(delay)
        if fails:
            return None  # its helper could not: the plan runs it
        if not hasattr(self.own, "measurer"):
            encoder = load_encoder(self.spec)
            self.own.measurer = RecordMeasurer(self.spec, encoder, job.block_size)
        self.measured += 1
        return pickle.loads(pickle.dumps(job)).run(self.own.measurer)  # as a child gets it


class Measured:
    def __init__(self, future: Future) -> None:
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def result(self):
        return self.future.result()


def test_helpers_that_finish_out_of_order_refuse_and_fail_make_the_same_plan(spec):
    alone = build_plan(spec, load_encoder(spec), progress=False)
    helpers = ThreadHelpers(spec)
    helped = build_plan(spec, load_encoder(spec), progress=False, helpers=helpers)
    assert helpers.measured > 10 and helpers.offered > helpers.measured
    assert helpers.kinds == {"MeasureSlice", "ChunkEnds", "SharedStarts"}
    kinds = alone.rejects["reject_kind"].to_list()
    assert {"duplicate_id", "null_field", "null_id", "over_length"} == set(kinds)
    assert alone.exact_records > 100
    assert alone.records["answered_from"].is_not_null().sum() == 39  # 40 alike: 1 sent
    assert_same_plan(alone, helped)


def test_the_start_every_prompt_shares_counts_what_the_helpers_measured(spec, tmp_path):
    """Only a later slice, measured by a helper, shows the start is shorter than the
    plan's first records say ("Order" in all of them, "Zebra" in one at the end)."""
    data = spec.model_dump(mode="json")
    data["prompt"] = {"template": "{subject}: {body}"}  # no system text: the subject leads
    write_records(
        tmp_path / "in" / "c.parquet", [{"ticket_id": "z", "subject": "Zebra", "body": "x"}]
    )
    one = validate_spec(data)
    seen = []
    for helpers in (None, ThreadHelpers(one, refuse_every=0, fail_every=0)):
        measurer = RecordMeasurer(one, load_encoder(one), block_size(one))
        with ChunkKeys() as chunks:
            keys = firstpass.measure_input(
                *open_job_input(one), measurer, False, None, chunks, True, helpers
            )
            seen.append((keys, measurer.common_start(), measurer.exact_records, chunks.records))
    (alone, start, exact, chunks), (helped, *rest) = seen
    assert helped.equals(alone) and rest == [start, exact, chunks]
    assert "Order" not in "".join(start) and exact > 100


def test_an_increment_measures_its_new_records_itself(spec):
    """The ids planned before stay with the plan's process: no helper gets a slice to
    measure (the shared starts of the new records are theirs to encode)."""
    helpers = ThreadHelpers(spec, refuse_every=0, fail_every=0)
    known = KnownIds(pl.Series([f"t{i}" for i in range(700)]))
    alone = build_plan(spec, load_encoder(spec), progress=False, skip_ids=known)
    helped = build_plan(spec, load_encoder(spec), progress=False, skip_ids=known, helpers=helpers)
    assert helpers.kinds == {"ChunkEnds", "SharedStarts"}
    assert_same_plan(alone, helped)


def _ready_children(spec) -> None:
    encoding.start_spare(spec, load_encoder(spec), 10_000)
    children = encoding._spares[encoding.pickle.dumps(spec)]
    deadline = time.monotonic() + 120
    while not all(child.ready() for child in children):
        assert time.monotonic() < deadline, "the encoding process never got ready"
        time.sleep(0.1)


def test_the_runs_encoding_processes_measure_the_same_plan(spec):
    alone = build_plan(spec, load_encoder(spec), progress=False)
    _ready_children(spec)
    with encoding.lend_spare(spec) as helpers:
        helped = build_plan(spec, load_encoder(spec), progress=False, helpers=helpers)
    kept = encoding._take_spare(spec)
    encoding._close_all(kept or [])
    assert helpers.count == 1 and helpers.sent > 5
    assert kept == helpers.children  # kept for the feed
    assert_same_plan(alone, helped)


def test_a_process_killed_while_it_measures_costs_no_slice(spec, monkeypatch):
    alone = build_plan(spec, load_encoder(spec), progress=False)
    _ready_children(spec)
    with encoding.lend_spare(spec) as helpers:
        child, sent = helpers.children[0], helpers.submit

        def killing(job):
            measuring = sent(job)
            if helpers.sent == 3:  # slices sent and not yet answered are lost with it
                child.process.kill()
            return measuring

        monkeypatch.setattr(helpers, "submit", killing)
        helped = build_plan(spec, load_encoder(spec), progress=False, helpers=helpers)
    assert helpers.sent >= 3 and child.process.poll() is not None
    assert encoding._take_spare(spec) is None  # a dead one is no feed's
    assert_same_plan(alone, helped)


def test_a_plan_that_fails_with_a_job_out_leaves_that_process_to_no_feed(spec):
    """Its answer to the plan's job would be read as a batch's ids: it is killed."""
    _ready_children(spec)
    records = pl.DataFrame({"ticket_id": ["a"], "subject": ["s"], "body": ["b"]})
    with pytest.raises(OSError, match="disk"), encoding.lend_spare(spec) as helpers:
        job = firstpass.MeasureSlice(16, None, False, (0, 0), records)
        assert helpers.submit(job) is not None
        raise OSError("disk")
    assert encoding._take_spare(spec) is None
    assert helpers.children[0].process.wait(timeout=30) is not None


def test_jobs_plan_builds_its_plan_with_the_processes_a_run_would_get(spec, tmp_path, monkeypatch):
    """`jobs plan` starts them, lends them to its plan, and closes them after: the same
    summary as a plan built alone, and no process left behind."""
    from typer.testing import CliRunner

    from nightshift.cli import app

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    lent, lend = [], encoding.lend_spare

    @contextlib.contextmanager
    def lending(spec):
        with lend(spec) as helpers:
            lent.append(helpers)
            yield helpers

    monkeypatch.setattr(encoding, "lend_spare", lending)
    helped = CliRunner().invoke(app, ["jobs", "plan", str(path), "--json"])
    monkeypatch.setenv("NIGHTSHIFT_ENCODE_PROCESSES", "0")
    alone = CliRunner().invoke(app, ["jobs", "plan", str(path), "--json"])
    assert helped.exit_code == 0 == alone.exit_code, helped.output + alone.output
    assert json.loads(helped.output) == json.loads(alone.output)
    assert lent[0].count == 1 and lent[1:] == [None]
    assert all(child.process.poll() is not None for child in lent[0].children)
    assert encoding._spares == {}


def test_an_empty_prompt_is_the_lowest_start_whoever_measured_it(models, tmp_path, monkeypatch):
    """A raw prompt of nothing (no chat frame, no BOS text) shares nothing with the
    others: every prompt's common start is empty, whichever process measured it (a
    falsy b"" was once dropped by the plan's own running minimum, not by a helper's)."""
    monkeypatch.setattr(firstpass, "READ_BATCH", 100)
    monkeypatch.setattr(firstpass, "MEASURE_BATCH", 100)
    lead = "Please classify this support ticket from our customer portal carefully: "
    rows = [{"ticket_id": f"t{i}", "subject": "s", "body": f"{lead}case {i}"} for i in range(600)]
    rows[5]["body"] = rows[450]["body"] = ""  # measured here, and by a helper
    write_records(tmp_path / "in" / "a.parquet", rows)
    data = spec_dict(models["plain"], tmp_path / "in", tmp_path / "out")
    data["prompt"] = {"template": "{body}", "chat_template": False}
    one = validate_spec(data)
    alone = build_plan(one, load_encoder(one), progress=False)
    helpers = ThreadHelpers(one, refuse_every=0, fail_every=0)
    helped = build_plan(one, load_encoder(one), progress=False, helpers=helpers)
    assert helpers.measured > 2
    assert_same_plan(alone, helped)
    measurer = RecordMeasurer(one, load_encoder(one), block_size(one))
    with ChunkKeys() as chunks:
        firstpass.measure_input(*open_job_input(one), measurer, False, None, chunks)
    assert "".join(measurer.common_start()) == ""


class OneAtATime:
    """A helper that takes the first job only, and answers it (or fails) once asked."""

    count = 1

    def __init__(self, fails: bool) -> None:
        self.fails, self.taken = fails, False

    def submit(self, job):
        if self.taken:
            return None
        self.taken = True
        return SimpleNamespace(done=lambda: False, result=lambda: None if self.fails else "first")


@pytest.mark.parametrize("helper_fails", [False, True], ids=["answers", "fails"])
def test_an_error_raised_here_waits_its_turn(helper_fails):
    """The plan reports its first bad record, as alone: a later job's error, raised here
    while an earlier one is out at a helper, is raised only after that one is kept (or
    fails itself, run here)."""

    def first():
        raise ValueError("the first bad record")

    def second():
        raise ValueError("a later bad record")

    kept = []
    order = InOrder(OneAtATime(helper_fails), lambda answer, by_helper: kept.append(answer))
    job = SimpleNamespace(block_size=16, records=pl.DataFrame({"x": [1]}))
    order.add(job, first)
    order.add(job, second)
    expected = "a later bad record" if not helper_fails else "the first bad record"
    with pytest.raises(ValueError, match=expected):
        order.finish()
    assert kept == ([] if helper_fails else ["first"])
