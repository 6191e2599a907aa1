"""Incremental nights: each night's exact repeats are answered once, and a night whose
input gained files starts its engine while it plans (``work_may_be_left``)."""

from __future__ import annotations

import os

from nightshift.engines.fake import FakeEngine
from nightshift.io.outputs import JobOutput, committed_files
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job
from nightshift.running.runner import work_may_be_left

from .conftest import spec_dict, write_records
from .durable import assert_exactly_once, read_table, report
from .test_s3_input import s3, upload  # noqa: F401  (s3: a fixture)

NIGHT1 = 20  # distinct prompts, no repeats
NIGHT2_DISTINCT = 6
NIGHT2 = 18  # each of night 2's prompts three times


def _records(prefix: str, count: int, distinct: int) -> list[dict]:
    return [
        {
            "ticket_id": f"{prefix}{i:03d}",
            "subject": f"{prefix}s{i % distinct}",
            "body": f"b{i % distinct}",
        }
        for i in range(count)
    ]


def _spec(models, tmp_path, **run):
    data = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out", plan={"shard_records": 8})
    data["run"] = {"engine": "fake", **run}
    return validate_spec(data)


def _rows_by_id(location: str) -> dict:
    output, rows = JobOutput(location), {}
    for kind in ("results", "failed"):
        for uri in committed_files(location, kind):
            rows.update({r["ticket_id"]: r for r in read_table(output, uri).to_pylist()})
    return rows


def test_a_later_nights_repeats_are_answered_once_after_a_night_without_any(models, tmp_path):
    write_records(tmp_path / "in" / "night1.parquet", _records("a", NIGHT1, NIGHT1))
    spec = _spec(models, tmp_path)
    first = FakeEngine()
    run_job(spec, engine=first, progress=False)
    assert len(first.order) == NIGHT1
    assert report(str(tmp_path / "out"))["repeats"]["copies"] == 0

    night2 = _records("b", NIGHT2, NIGHT2_DISTINCT)
    write_records(tmp_path / "in" / "night2.parquet", night2)
    second = FakeEngine()
    run_job(spec, engine=second, progress=False)
    assert len(second.order) == NIGHT2_DISTINCT  # once per distinct prompt

    location = str(tmp_path / "out")
    rows = _rows_by_id(location)
    for i, record in enumerate(night2):
        row, original = rows[record["ticket_id"]], rows[f"b{i % NIGHT2_DISTINCT:03d}"]
        assert row["text"] == original["text"] and row["subject"] == record["subject"]
        expected = None if i < NIGHT2_DISTINCT else original["ticket_id"]
        assert row["answered_from"] == expected
    copies = NIGHT2 - NIGHT2_DISTINCT
    manifest = JobOutput(location).plans.manifest()
    assert manifest["repeats"]["copies"] == copies
    assert [i["repeats"]["copies"] for i in manifest["increments"]] == [0, copies]
    done = report(location)
    assert done["repeats"]["copies"] == copies
    assert done["repeats"]["this_run"]["rows"] == copies
    assert_exactly_once(location, "ticket_id", [r["ticket_id"] for r in rows.values()])
    assert len(rows) == NIGHT1 + NIGHT2


def test_repeats_add_up_over_nights_that_each_have_some(models, tmp_path):
    write_records(tmp_path / "in" / "night1.parquet", _records("a", 12, 4))
    spec = _spec(models, tmp_path)
    run_job(spec, engine=FakeEngine(), progress=False)
    write_records(tmp_path / "in" / "night2.parquet", _records("b", 10, 5))
    engine = FakeEngine()
    run_job(spec, engine=engine, progress=False)
    assert len(engine.order) == 5
    manifest = JobOutput(str(tmp_path / "out")).plans.manifest()
    assert manifest["repeats"]["copies"] == 8 + 5
    assert manifest["repeats"]["prompt_tokens_not_sent"] == sum(
        i["repeats"]["prompt_tokens_not_sent"] for i in manifest["increments"]
    )
    assert report(str(tmp_path / "out"))["repeats"]["copies"] == 13


def test_an_incremental_night_with_new_input_files_starts_its_engine_early(models, tmp_path):
    write_records(tmp_path / "in" / "night1.parquet", _records("a", 10, 10))
    spec = _spec(models, tmp_path)
    run_job(spec, engine=FakeEngine(), progress=False)
    assert not work_may_be_left(spec, False, False)  # all committed, input as planned

    write_records(tmp_path / "in" / "night2.parquet", _records("b", 5, 5))
    assert work_may_be_left(spec, False, False)  # a new file: the night may generate
    assert not work_may_be_left(_spec(models, tmp_path, incremental=False), False, False)
    run_job(spec, engine=FakeEngine(), progress=False)
    assert not work_may_be_left(spec, False, False)

    rewritten = tmp_path / "in" / "night2.parquet"
    write_records(rewritten, _records("b", 6, 6))  # the same file, one record more
    os.utime(rewritten, ns=(1, 1))  # whatever the clock: the listing differs in size
    assert work_may_be_left(spec, False, False)
    engine = FakeEngine()
    run_job(spec, engine=engine, progress=False)
    assert len(engine.order) == 1
    assert not work_may_be_left(spec, False, False)


def test_a_night_with_a_touched_file_but_no_new_record_records_the_listing(models, tmp_path):
    path = write_records(tmp_path / "in" / "night1.parquet", _records("a", 10, 10))
    spec = _spec(models, tmp_path)
    run_job(spec, engine=FakeEngine(), progress=False)
    os.utime(path, ns=(10**18, 10**18))  # same records, another modification time
    assert work_may_be_left(spec, False, False)
    engine = FakeEngine()
    run_job(spec, engine=engine, progress=False)  # nothing new: nothing generated
    assert engine.order == []
    assert not work_may_be_left(spec, False, False)  # the next night starts none early


def test_a_rerun_over_the_same_input_files_reads_no_id(models, tmp_path, monkeypatch):
    """The listing plan.json keeps says the files are as planned: the planned ids and the
    input's are not read again (a million of each took 1-2 s of every resume). A touched
    file is read again."""
    import nightshift.running.runner as runner

    path = write_records(tmp_path / "in" / "night1.parquet", _records("a", 10, 10))
    spec = _spec(models, tmp_path)
    run_job(spec, engine=FakeEngine(), progress=False)
    looked = []
    real = runner.add_new_records
    monkeypatch.setattr(
        runner, "add_new_records", lambda *a, **k: looked.append(1) or real(*a, **k)
    )
    run_job(spec, engine=FakeEngine(), progress=False)
    assert looked == []
    os.utime(path, ns=(10**18, 10**18))
    run_job(spec, engine=FakeEngine(), progress=False)
    assert looked == [1]


def test_a_plan_that_recorded_no_input_listing_may_have_work_left(models, tmp_path):
    """A plan written before listings were recorded: the input cannot be compared."""
    import json

    write_records(tmp_path / "in" / "night1.parquet", _records("a", 10, 10))
    spec = _spec(models, tmp_path)
    run_job(spec, engine=FakeEngine(), progress=False)
    plan_json = tmp_path / "out" / "plan" / "plan.json"
    manifest = json.loads(plan_json.read_text())
    manifest.pop("input_listing")
    plan_json.write_text(json.dumps(manifest))
    assert work_may_be_left(spec, False, False)


def test_an_s3_input_listing_tells_a_new_file_apart(s3, models, tmp_path):  # noqa: F811
    from nightshift.scheduling.increments import input_listing

    upload(s3, "in/a.parquet", _records("a", 5, 5))
    upload(s3, "in/sub/b.parquet", _records("b", 5, 5))
    data = spec_dict(models["chat"], "s3://tickets/in", tmp_path / "out")
    spec = validate_spec({**data, "run": {"engine": "fake"}})
    run_job(spec, engine=FakeEngine(), progress=False)
    before = input_listing(spec)
    assert before is not None and before == input_listing(spec)
    assert not work_may_be_left(spec, False, False)
    upload(s3, "in/sub/c.parquet", _records("c", 5, 5))
    assert input_listing(spec) != before and work_may_be_left(spec, False, False)
