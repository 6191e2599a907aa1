"""Every answer belongs to its record (issue 18): request keys unique in the run, aborted
engine outputs that are no answers, overlapping attempts on one shard, and a failed
engine start that leaves nothing running. All on the fake engine, through ``run_job``."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import polars as pl
import pytest

import nightshift.running.engines as engines_module
import nightshift.running.feed as feed_module
from nightshift.engines.fake import FakeEngine
from nightshift.errors import EngineError, ShardsFailedError
from nightshift.io.shardstore import ShardStore
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job
from nightshift.running.runner import start_run

from .conftest import spec_dict, write_records
from .durable import assert_exactly_once, committed_ids, generated_prompts, read_table


def rows(prefix: str, n: int) -> list[dict]:
    return [
        {"ticket_id": f"{prefix}{i}", "subject": f"{prefix}-s{i}", "body": f"{prefix} body {i}"}
        for i in range(n)
    ]


def job(models, input_path: Path, out: Path, shard_records: int = 40, **run):
    """A generate job (answers differ per prompt) in shards of 40, chunks of 8."""
    data = spec_dict(
        models["chat"],
        input_path,
        out,
        task={"kind": "generate"},
        plan={"shard_records": shard_records},
        run={"engine": "fake", "chunk_records": 8, **run},
    )
    return validate_spec(data)


def answers(location: Path) -> dict[str, tuple]:
    """Each committed record's kept column, answer and prompt size, by id."""
    from nightshift.io.outputs import JobOutput, committed_files

    output = JobOutput(str(location))
    found: dict[str, tuple] = {}
    for kind in ("results", "failed"):
        for uri in committed_files(str(location), kind):
            table = pl.from_arrow(read_table(output, uri))
            for row in table.iter_rows(named=True):
                assert row["ticket_id"] not in found, f"{row['ticket_id']} twice"
                found[row["ticket_id"]] = (row["subject"], row["text"], row["prompt_tokens"])
    return found


def clean_answers(models, tmp_path: Path, records: list[dict]) -> dict[str, tuple]:
    """The answers of one uninterrupted run over ``records``."""
    write_records(tmp_path / "clean-in" / "all.parquet", records)
    run_job(
        job(models, tmp_path / "clean-in", tmp_path / "clean"), engine=FakeEngine(), progress=False
    )
    return answers(tmp_path / "clean")


def test_a_night_added_to_an_interrupted_night_answers_every_record_with_its_own_answer(
    models, tmp_path
):
    """Night one dies in its second shard (positions 40-59, 5 of them checkpointed);
    night two's 60 records are planned from position 0 again. The rerun sends the old
    shard's rest and the new shards through one feed: every id gets its own answer."""
    first, second = rows("a", 60), rows("b", 60)
    write_records(tmp_path / "in" / "night-1.parquet", first)
    spec = job(models, tmp_path / "in", tmp_path / "out", shard_attempts=1)
    with pytest.raises(ShardsFailedError, match="shard 1"):
        run_job(spec, engine=FakeEngine(die_after=45), progress=False)

    write_records(tmp_path / "in" / "night-2.parquet", second)
    run_job(spec, engine=FakeEngine(), progress=False)

    ids = [r["ticket_id"] for r in first + second]
    assert_exactly_once(str(tmp_path / "out"), "ticket_id", ids)
    assert answers(tmp_path / "out") == clean_answers(models, tmp_path, first + second)


def written_rows(monkeypatch) -> list[dict]:
    """Spy on every table the shard store writes (chunks and commits)."""
    seen: list[dict] = []

    def spying(put):
        def spy(self, key, table, kind):
            seen.extend(table.to_pylist())
            return put(self, key, table, kind)

        return spy

    for name in ("_put_chunk", "_put_table"):  # checkpoint chunks, and commits
        monkeypatch.setattr(ShardStore, name, spying(getattr(ShardStore, name)))
    return seen


def test_aborted_results_are_never_rows_and_a_rerun_answers_exactly_those(
    models, ticket_dir, tmp_path, monkeypatch
):
    written = written_rows(monkeypatch)
    spec = job(models, ticket_dir, tmp_path / "out", shard_attempts=1)
    engine = FakeEngine(abort_every=7)
    with pytest.raises(ShardsFailedError, match="left unanswered"):
        run_job(spec, engine=engine, progress=False)
    assert len(engine.aborted) == 120 // 7
    assert written and not [r for r in written if r["finish_reason"] in ("abort", None)]
    # Every shard had a record aborted: none commits, and their rows wait as checkpoints.
    assert committed_ids(str(tmp_path / "out"), "ticket_id")["results"] == []

    log = tmp_path / "rerun.log"
    run_job(spec, engine=FakeEngine(log=str(log)), progress=False)
    assert sorted(generated_prompts(log)) == sorted(engine.aborted)
    assert not [r for r in written if r["finish_reason"] in ("abort", None)]
    records = pl.read_parquet(ticket_dir).to_dicts()
    assert answers(tmp_path / "out") == clean_answers(models, tmp_path, records)


def test_aborted_records_are_asked_again_in_place(models, ticket_dir, tmp_path):
    """With attempts left, a shard with aborted records runs them again at once."""
    outcome = run_job(
        job(models, ticket_dir, tmp_path / "out"), engine=FakeEngine(abort_every=7), progress=False
    )
    assert outcome.report["shards"]["complete"]
    records = pl.read_parquet(ticket_dir).to_dicts()
    assert answers(tmp_path / "out") == clean_answers(models, tmp_path, records)


def test_a_transient_engine_error_is_sent_again_then_is_a_failed_row(models, tmp_path):
    write_records(tmp_path / "in" / "a.parquet", rows("a", 20))
    flaky = run_job(
        job(models, tmp_path / "in", tmp_path / "flaky"),
        engine=FakeEngine(flaky_every=4),
        progress=False,
    )
    assert flaky.report["records"]["failed"] == 0  # each one answered when sent again
    assert answers(tmp_path / "flaky") == clean_answers(models, tmp_path, rows("a", 20))

    broken = job(models, tmp_path / "in", tmp_path / "broken")
    run_job(broken, engine=FakeEngine(flaky_every=1), progress=False)
    failed = pl.read_parquet(tmp_path / "broken" / "failed" / "*.parquet")
    assert failed.height == 20 and set(failed["finish_reason"]) == {"error"}
    assert set(failed["error"]) == {
        "engine: request-level internal error (fake, flaky_every); sent 3 times"
    }


class WaitingEngine:
    """A fake engine that, once its run has started (its shard resumed), waits for
    ``go`` before answering: so two attempts resume from the same checkpoint."""

    def __init__(self, inner: FakeEngine, started: threading.Event, go: threading.Event):
        self.inner, self.started, self.go, self.info = inner, started, go, inner.info

    def run(self, requests, sampling):
        self.started.set()
        assert self.go.wait(120)
        yield from self.inner.run(requests, sampling)

    def stats(self):
        return self.inner.stats()

    def close(self):
        self.inner.close()


def test_two_attempts_on_one_shard_commit_one_row_per_record(models, tmp_path):
    """Two runs on one output both resume shard 0 with nothing checkpointed, both answer
    50 of its 60 records and die. A third run merges their checkpoints and commits the
    shard with exactly one row per record."""
    write_records(tmp_path / "in" / "a.parquet", rows("a", 60))
    spec = job(models, tmp_path / "in", tmp_path / "out", shard_records=60, shard_attempts=1)
    start_run(spec, progress=False)  # plan once; both attempts take up this plan
    started, go, errors = threading.Event(), threading.Event(), []

    def second_attempt():
        engine = WaitingEngine(FakeEngine(die_after=50), started, go)
        try:
            run_job(spec, engine=engine, progress=False)
        except ShardsFailedError as exc:
            errors.append(exc)

    other = threading.Thread(target=second_attempt)
    other.start()
    assert started.wait(120)  # the second attempt has resumed shard 0: nothing done
    with pytest.raises(ShardsFailedError):
        run_job(spec, engine=FakeEngine(die_after=50), progress=False)
    go.set()
    other.join(120)
    assert len(errors) == 1

    outcome = run_job(spec, engine=FakeEngine(), progress=False)
    assert outcome.report["shards"]["complete"]
    assert_exactly_once(str(tmp_path / "out"), "ticket_id", [r["ticket_id"] for r in rows("a", 60)])
    assert answers(tmp_path / "out") == clean_answers(models, tmp_path, rows("a", 60))


def test_failed_engine_starts_leave_no_thread_and_no_shard_copy(
    models, ticket_dir, tmp_path, monkeypatch
):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(feed_module, "REQUEST_BATCH", 4)  # more batches than fit ahead

    def no_engine(spec):
        raise EngineError("vLLM could not start: no GPU")

    monkeypatch.setattr(engines_module, "build_engine", no_engine)
    spec = job(models, ticket_dir, tmp_path / "out")
    before = {t.ident for t in threading.enumerate()}
    for _ in range(3):
        with pytest.raises(EngineError, match="no GPU"):
            run_job(spec, progress=False)
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert left == []
    assert list(temp.glob("nightshift-shard-*")) == []


@pytest.mark.parametrize(
    ("reason", "aborted", "retryable"),
    [
        ("stop", False, False),
        ("length", False, False),
        ("abort", True, False),
        (None, True, False),
        ("error", False, True),
    ],
)
def test_vllm_finish_reasons_map_to_the_engine_contract(reason, aborted, retryable):
    """vLLM's "abort" (and an unfinished output) is no answer; "error" is a retryable
    failure of that request; "stop" and "length" are answers."""
    from types import SimpleNamespace

    from nightshift.engines.vllm_engine import _result

    completion = SimpleNamespace(text="hi", finish_reason=reason, token_ids=[7, 8])
    out = SimpleNamespace(outputs=[completion], prompt_token_ids=[1, 2, 3], num_cached_tokens=0)
    result = _result(5, out)
    assert (result.key, result.aborted, result.retryable) == (5, aborted, retryable)
    assert (result.error is not None) == retryable
    if not aborted:
        assert (result.text, result.output_tokens, result.prompt_tokens) == ("hi", 2, 3)
