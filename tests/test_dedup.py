"""Exact repeats within a job are generated once; every record still gets its own row."""

from __future__ import annotations

import signal

import pyarrow as pa
import pytest
import yaml

from nightshift.engines.fake import FakeEngine, prompt_digest
from nightshift.io.outputs import JobOutput, committed_files
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records
from .durable import assert_exactly_once, generated_prompts, read_table, report, run_cli
from .inprocess import vllm_in_this_process

RECORDS = 60
DISTINCT = 20  # every prompt appears 3 times, under other ids


def _rows() -> list[dict]:
    return [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i % DISTINCT}", "body": f"body {i % DISTINCT}"}
        for i in range(RECORDS)
    ]


def _job(models, tmp_path, sampling=None, **sections) -> dict:
    rows = _rows()
    for n in range(3):
        write_records(tmp_path / "in" / f"p{n}.parquet", rows[n * 20 : (n + 1) * 20])
    return spec_dict(
        models["chat"],
        tmp_path / "in",
        tmp_path / "out",
        plan={"shard_records": 8},
        sampling={"max_tokens": 8, **(sampling or {})},
        **sections,
    )


def _rows_by_id(location: str) -> dict:
    output = JobOutput(location)
    rows = {}
    for kind in ("results", "failed"):
        for uri in committed_files(location, kind):
            for row in read_table(output, uri).to_pylist():
                rows[row["ticket_id"]] = row
    return rows


def _original_of(i: int) -> str:
    return f"t{i % DISTINCT:03d}"


def test_each_distinct_prompt_is_sent_once_and_every_id_gets_its_originals_answer(models, tmp_path):
    spec = validate_spec(_job(models, tmp_path))
    engine = FakeEngine()
    run_job(spec, engine=engine, progress=False)
    assert len(engine.order) == DISTINCT  # the engine saw each distinct prompt once
    rows = _rows_by_id(str(tmp_path / "out"))
    assert len(rows) == RECORDS
    for i in range(RECORDS):
        row, original = rows[f"t{i:03d}"], rows[_original_of(i)]
        assert row["text"] == original["text"] and row["label"] == original["label"]
        assert row["subject"] == f"s{i % DISTINCT}"  # its own kept columns
        assert row["answered_from"] == (None if i < DISTINCT else _original_of(i))
    done = report(str(tmp_path / "out"))
    assert done["repeats"]["copies"] == RECORDS - DISTINCT
    assert done["repeats"]["prompt_tokens_not_sent"] > 0  # the plan's estimate
    saved = done["repeats"]["this_run"]
    assert saved["rows"] == RECORDS - DISTINCT
    copies = [r for r in rows.values() if r["answered_from"]]
    assert saved["prompt_tokens_not_sent"] == sum(
        rows[r["answered_from"]]["prompt_tokens"] for r in copies
    )
    assert all(r["prompt_tokens"] == 0 == r["output_tokens"] for r in copies)  # not sent
    assert done["tokens"]["prompt"] == sum(r["prompt_tokens"] for r in rows.values())
    plan = JobOutput(str(tmp_path / "out")).plans.manifest()
    assert plan["repeats"]["copies"] == RECORDS - DISTINCT
    # shards are cut over the distinct work: 20 originals in shards of 8
    assert len(plan["shards"]["each"]) == 3


def test_with_temperature_and_no_seed_each_record_is_its_own_sample(models, tmp_path):
    spec = validate_spec(_job(models, tmp_path, sampling={"temperature": 0.7}))
    engine = FakeEngine()
    run_job(spec, engine=engine, progress=False)
    assert len(engine.order) == RECORDS
    assert all(r["answered_from"] is None for r in _rows_by_id(str(tmp_path / "out")).values())


def test_a_fixed_seed_dedups_at_any_temperature(models, tmp_path):
    spec = validate_spec(_job(models, tmp_path, sampling={"temperature": 0.7, "seed": 1}))
    engine = FakeEngine()
    run_job(spec, engine=engine, progress=False)
    assert len(engine.order) == DISTINCT


def test_a_failed_original_fails_its_copies_with_the_same_error(models, tmp_path):
    spec = validate_spec(_job(models, tmp_path))
    failing = {}

    def fail_first(ids):
        failing.setdefault("digest", prompt_digest(ids))
        return "boom" if prompt_digest(ids) == failing["digest"] else None

    run_job(spec, engine=FakeEngine(fail_when=fail_first), progress=False)
    location = str(tmp_path / "out")
    output = JobOutput(location)
    failed = pa.concat_tables(
        [read_table(output, uri) for uri in committed_files(location, "failed")]
    ).to_pylist()
    assert len(failed) == 3
    originals = {r["answered_from"] or r["ticket_id"] for r in failed}
    assert len(originals) == 1
    assert {r["error"] for r in failed} == {"engine: boom"}
    assert_exactly_once(location, "ticket_id", [r["ticket_id"] for r in _rows()])


@pytest.mark.parametrize("point", ["chunk.written:2", "shard.data_written:2"])
def test_a_kill_and_resume_stays_exact(models, tmp_path, point):
    spec = _job(models, tmp_path, run={"chunk_records": 4, "engine": "fake"})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    first = run_cli(path, env={"NIGHTSHIFT_CRASH_AT": point})
    assert first.returncode == -signal.SIGKILL, first.stderr
    log = tmp_path / "second.log"
    second = run_cli(path, env={"NIGHTSHIFT_FAKE_LOG": str(log)})
    assert second.returncode == 0, second.stderr
    location = str(tmp_path / "out")
    assert_exactly_once(location, "ticket_id", [r["ticket_id"] for r in _rows()])
    rows = _rows_by_id(location)
    for i in range(RECORDS):
        assert rows[f"t{i:03d}"]["text"] == rows[_original_of(i)]["text"]
    assert len(generated_prompts(log)) < DISTINCT  # the rerun sent only what was left


@pytest.mark.engine
@pytest.mark.engine_in_process
def test_repeats_and_the_cache_on_the_real_engine(models, tmp_path):
    """vLLM is sent each distinct prompt once; a second job sharing cache.path is sent
    only its new prompts, and every old id keeps its answer."""
    from nightshift.running.engines import start_vllm

    rows = _rows()
    write_records(tmp_path / "a" / "p.parquet", rows[:30])  # 20 distinct, 10 repeats
    extra = [{"ticket_id": f"n{i}", "subject": "new", "body": f"fresh {i}"} for i in range(5)]
    write_records(tmp_path / "b" / "p.parquet", rows + extra)

    def spec(name: str):
        return validate_spec(
            spec_dict(
                models["chat"],
                tmp_path / name,
                tmp_path / f"out-{name}",
                cache={"path": str(tmp_path / "cache")},
            )
        )

    with vllm_in_this_process():  # one engine for both jobs, started in 3 s
        engine = start_vllm(spec("a"))
    try:
        first = run_job(spec("a"), engine=engine, progress=False).report
        second = run_job(spec("b"), engine=engine, progress=False).report
    finally:
        engine.close()
    assert first["response_cache"]["stored"] == DISTINCT
    assert first["repeats"]["this_run"]["rows"] == 10
    assert second["response_cache"] == {
        **second["response_cache"],
        "hits": DISTINCT,
        "stored": 5,
    }
    assert second["this_run"]["records_answered"] == RECORDS + 5
    a, b = _rows_by_id(str(tmp_path / "out-a")), _rows_by_id(str(tmp_path / "out-b"))
    for i in range(RECORDS):
        assert b[f"t{i:03d}"]["text"] == b[_original_of(i)]["text"]
        if f"t{i:03d}" in a:
            assert a[f"t{i:03d}"]["text"] == b[f"t{i:03d}"]["text"]


def test_the_predicted_reuse_counts_only_the_prompts_sent(models, tmp_path):
    """Copies send nothing, so the plan's predicted share of prompt tokens from cache is
    that of the distinct prompts alone, as vLLM will measure it (it was diluted by every
    copy's tokens: 400,000 records of 300 tickets predicted 0.0% against 65.6% served)."""
    from nightshift.scheduling.plan import build_plan, load_encoder

    shared = "The customer writes about the same order again and again. " * 20
    rows = [{**row, "subject": shared + row["subject"]} for row in _rows()]
    write_records(tmp_path / "all" / "p.parquet", rows)
    write_records(tmp_path / "distinct" / "p.parquet", rows[:DISTINCT])
    specs = [
        validate_spec(spec_dict(models["chat"], tmp_path / name, tmp_path / f"out-{name}"))
        for name in ("all", "distinct")
    ]
    encoder = load_encoder(specs[0])
    predicted = [build_plan(s, encoder, progress=False).prefix_reuse["predicted"] for s in specs]
    assert predicted[0] > 0.5 and predicted[0] == pytest.approx(predicted[1])


def test_copies_follow_their_original_and_the_shards_run_in_order(models, tmp_path):
    """Each copy sits right after its original (the copies carried a measurement column
    of the same name as the sort key, and were placed by it: near the start, in a late
    shard, so the manifest listed the shards out of run order and the flow fed them so)."""
    from nightshift.scheduling.plan import build_plan, load_encoder

    # Lengths unlike the input order, so that the run order (longest first) is not it.
    rows = [{**row, "body": row["body"] * (1 + int(row["subject"][1:]) % 7)} for row in _rows()]
    write_records(tmp_path / "mixed" / "p.parquet", rows)
    data = spec_dict(models["chat"], tmp_path / "mixed", tmp_path / "out")
    spec = validate_spec({**data, "plan": {"shard_records": 8}})
    plan = build_plan(spec, load_encoder(spec), progress=False)
    assert plan.records["answered_from"].is_not_null().sum() == RECORDS - DISTINCT
    records = plan.records.sort("position")
    assert records["position"].to_list() == list(range(RECORDS))
    assert records["shard"].is_sorted()
    assert [s["index"] for s in plan.shard_summaries()] == plan.shards
    original = None
    for row in records.iter_rows(named=True):
        if row["answered_from"] is None:
            original = row
        else:
            assert row["answered_from"] == original["record_id"]
            assert row["shard"] == original["shard"]


def test_jobs_plan_says_how_many_records_repeat_another(models, tmp_path, write_spec):
    from typer.testing import CliRunner

    from nightshift.cli import app

    result = CliRunner().invoke(app, ["jobs", "plan", str(write_spec(_job(models, tmp_path)))])
    assert result.exit_code == 0, result.output
    assert f"repeated prompts: {RECORDS - DISTINCT} record(s) repeat" in result.output


@pytest.mark.parametrize("shuffled", [False, True])
def test_the_first_record_in_input_order_is_the_original(shuffled):
    """Whatever order the keys come in (the measurement's is the input's), the earliest
    record by file and row answers, and the others are its copies."""
    import polars as pl

    from nightshift.scheduling.dedup import ANSWERED_FROM, DIGEST, split_copies

    keys = pl.DataFrame(
        {
            "_file": pl.Series([0, 0, 1, 1, 2], dtype=pl.UInt32),
            "_row": pl.Series([0, 1, 0, 1, 0], dtype=pl.UInt32),
            "record_id": ["a", "b", "c", "d", "e"],
            DIGEST: pl.Series([b"x", b"y", b"x", None, b"y"], dtype=pl.Binary),
        }
    )
    originals, copies = split_copies(keys.reverse() if shuffled else keys.clone())
    assert originals["record_id"].to_list() == ["a", "b", "d"]
    assert dict(copies.select("record_id", ANSWERED_FROM).iter_rows()) == {"c": "a", "e": "b"}
    alone, none = split_copies(keys.head(2))  # no repeats: nothing is a copy
    assert alone["record_id"].to_list() == ["a", "b"] and none.height == 0
    assert alone[ANSWERED_FROM].null_count() == 2 and DIGEST not in alone.columns


@pytest.mark.parametrize(
    ("ids", "wanted"),
    [
        (pa.chunked_array([["t1", "t2", "t3"], ["t4"]]), {"t2", "t4"}),
        (pa.chunked_array([pa.array([5, 6, 7], pa.uint32())]), {6}),  # Python ints: int64
        (pa.chunked_array([pa.array([5, 6, 7], pa.uint8())]), {6, 900}),  # 900 fits no uint8
    ],
)
def test_copies_are_picked_out_of_a_shard_by_id_whatever_its_type(ids, wanted):
    """What a resume reads back for each copy: by Arrow where it can, else by set."""
    from nightshift.running.copies import _among

    mask = _among(ids, wanted)
    assert [i for i, m in zip(ids.to_pylist(), pa.chunked_array([mask]).to_pylist(), strict=True)
            if m] == [i for i in ids.to_pylist() if i in wanted]  # fmt: skip


def test_a_records_key_is_blake2b_over_its_parts_each_after_its_length():
    """The key a plan finds each record's exact repeats by: BLAKE2b-96 over each part's
    UTF-8 bytes after its length as 8 little-endian bytes; two splits of one text are
    two keys."""
    import hashlib

    from nightshift.scheduling.dedup import _digest

    def one(parts):
        h = hashlib.blake2b(digest_size=12)
        for part in parts:
            data = part.encode()
            h.update(len(data).to_bytes(8, "little") + data)
        return h.digest()

    rows = [("ab", "c", ""), ("a", "bc", ""), ("", "", ""), ("é漢🙂", "\n" * 300, "x")]
    keys = [_digest(row) for row in rows]
    assert keys == [one(row) for row in rows]
    assert len(set(keys)) == 4  # no two splits of one text alike


def test_the_base_model_and_an_adapter_called_none_are_two_requests(models, tmp_path):
    """A record's adapter joins its repeat key: the base model's (null) piece is one no
    adapter's name makes, so a record under an adapter named "None" is never made a copy
    of a base-model record with the same prompt (nor takes its answer)."""
    import polars as pl

    from nightshift.jobs.loading import validate_spec
    from nightshift.scheduling.dedup import adapter_piece, prompt_digests
    from nightshift.scheduling.plan import load_encoder
    from nightshift.scheduling.render import renderer_for

    assert adapter_piece(None) != adapter_piece("None")
    assert adapter_piece("a") == "adapter:a"  # named adapters' keys as before
    assert adapter_piece("base model") != adapter_piece(None)
    spec = validate_spec(spec_dict(models["chat"], tmp_path, tmp_path / "out"))
    renderer = renderer_for(spec, load_encoder(spec))
    same = {"ticket_id": "t", "subject": "s", "body": "the same prompt"}
    records = pl.DataFrame([{**same, "lora": a} for a in (None, "None", "a", "a", None)])
    keys = prompt_digests(renderer, records, adapter_column="lora").to_list()
    assert keys[0] != keys[1]  # the base model and the adapter called "None"
    assert keys[2] == keys[3] and keys[0] == keys[4]  # true repeats stay repeats
    assert len(set(keys)) == 3
