"""A response cache shared by jobs (cache.path): a second job sends only what is new."""

from __future__ import annotations

import json
import subprocess
import sys

from nightshift.engines.fake import FakeEngine
from nightshift.io.objectstore import open_store
from nightshift.io.responsecache import PREFIX, ResponseCache, cache_stats
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records
from .test_dedup import _rows_by_id


def _rows(start: int, end: int) -> list[dict]:
    return [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i}", "body": f"body {i} " * (1 + i % 5)}
        for i in range(start, end)
    ]


def _spec(models, tmp_path, name: str, rows: list[dict]):
    write_records(tmp_path / f"in-{name}" / "p.parquet", rows)
    spec = spec_dict(
        models["chat"],
        tmp_path / f"in-{name}",
        tmp_path / f"out-{name}",
        plan={"shard_records": 16},
        cache={"path": str(tmp_path / "cache")},
    )
    return validate_spec(spec)


def test_a_second_job_sends_only_the_new_records(models, tmp_path):
    first = FakeEngine()
    done = run_job(_spec(models, tmp_path, "a", _rows(0, 30)), engine=first, progress=False)
    assert len(first.order) == 30
    assert done.report["response_cache"]["stored"] == 30
    second = FakeEngine()
    again = run_job(_spec(models, tmp_path, "b", _rows(0, 40)), engine=second, progress=False)
    assert len(second.order) == 10  # only the new ones went to the engine
    assert again.report["response_cache"]["hits"] == 30
    a, b = _rows_by_id(str(tmp_path / "out-a")), _rows_by_id(str(tmp_path / "out-b"))
    assert len(b) == 40
    for record_id, row in a.items():
        assert b[record_id]["text"] == row["text"] and b[record_id]["label"] == row["label"]
    assert cache_stats(str(tmp_path / "cache"))["entries"] == 40


def test_a_damaged_entry_is_ignored_and_regenerated(models, tmp_path):
    rows = _rows(0, 12)
    run_job(_spec(models, tmp_path, "a", rows), engine=FakeEngine(), progress=False)
    store = open_store(str(tmp_path / "cache"))
    keys = store.list(PREFIX)
    store.put_bytes(keys[0], store.get_bytes(keys[0])[:40])  # a partly written entry
    entry = json.loads(store.get_bytes(keys[1]))
    entry["answer"]["text"] = "tampered"  # its checksum no longer matches
    store.put_bytes(keys[1], json.dumps(entry).encode())
    assert cache_stats(str(tmp_path / "cache"))["damaged"] == 2
    engine = FakeEngine()
    done = run_job(_spec(models, tmp_path, "b", rows), engine=engine, progress=False)
    assert len(engine.order) == 2
    assert done.report["response_cache"]["damaged_ignored"] == 2
    assert all(r["text"] != "tampered" for r in _rows_by_id(str(tmp_path / "out-b")).values())
    assert cache_stats(str(tmp_path / "cache"))["damaged"] == 0  # regenerated in place


def test_concurrent_writers_never_overwrite_an_entry(tmp_path):
    answer = {"finish_reason": "stop", "prompt_tokens": 3, "output_tokens": 1, "cached_tokens": 0}
    one = ResponseCache.open(str(tmp_path / "c"), {"model": "m"})
    two = ResponseCache.open(str(tmp_path / "c"), {"model": "m"})
    one.put([1, 2, 3], {**answer, "text": "first"})
    two.put([1, 2, 3], {**answer, "text": "second"})  # lost the race: a conditional write
    assert (one.counts.stored, two.counts.stored) == (1, 0)
    assert two.get([1, 2, 3])["text"] == "first"
    other = ResponseCache.open(str(tmp_path / "c"), {"model": "other"})
    assert other.get([1, 2, 3]) is None  # another scope (model, sampling): another key


def test_cache_stats_and_prune_commands(tmp_path):
    cache = ResponseCache.open(str(tmp_path / "c"), {"model": "m"})
    answer = {"finish_reason": "stop", "prompt_tokens": 3, "output_tokens": 1, "cached_tokens": 0}
    for i in range(5):
        cache.put([i], {**answer, "text": str(i)})
    cli = [sys.executable, "-m", "nightshift.cli", "cache"]
    stats = subprocess.run([*cli, "stats", str(tmp_path / "c")], capture_output=True, text=True)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["entries"] == 5
    pruned = subprocess.run(
        [*cli, "prune", str(tmp_path / "c"), "--keep", "2"], capture_output=True, text=True
    )
    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 3" in pruned.stdout
    assert cache_stats(str(tmp_path / "c"))["entries"] == 2


def test_jobs_plan_estimates_output_lengths_from_the_cache(models, tmp_path):
    from nightshift.scheduling.dryrun import plan_summary

    run_job(_spec(models, tmp_path, "a", _rows(0, 30)), engine=FakeEngine(), progress=False)
    spec = _spec(models, tmp_path, "b", _rows(0, 40))
    spec = spec.model_copy(
        update={"cost": spec.cost.model_copy(update={"expected_tokens_per_s": 100.0})}
    )
    projection = plan_summary(spec)["projection"]
    assert "a sample of 30 answers in cache.path" in projection["note"]


def test_the_base_model_and_an_adapter_called_none_have_two_cache_scopes(tmp_path):
    """A record's own sampling and adapter pick its cache scope: the base model (None)
    and an adapter named "None" are two, never each other's answers."""
    from nightshift.engines.base import Sampling
    from nightshift.running.cached import RunCache

    cache = RunCache.at(str(tmp_path / "cache"), {"fingerprint_inputs": {}}, Sampling(4, 0.0))
    own = Sampling(8, 0.0)  # a record's own sampling, deterministic: cached
    base, named = cache._for(own, None), cache._for(own, "None")
    assert base is not None and named is not None
    assert base is not named and base.scope != named.scope
    assert cache._for(own, "None") is named  # one scope each, kept
