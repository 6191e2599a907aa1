"""The response cache (cache.path) answers only what a run would answer the same way:
never a sample, every choice detail restored, prune touching only its own entries, and
`jobs plan` reading only a bounded sample of this job's entries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import yaml

from nightshift.engines.fake import FakeEngine
from nightshift.io import responsecache
from nightshift.io.objectstore import open_store
from nightshift.io.outputs import JobOutput
from nightshift.io.responsecache import PREFIX, ResponseCache, cache_stats
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records
from .durable import generated_prompts, run_cli
from .test_batch_run import batch_cli, read_jsonl

ANSWER = {"finish_reason": "stop", "prompt_tokens": 3, "output_tokens": 1, "cached_tokens": 0}


def _generate_job(models, tmp_path: Path, out: str, rows: list[dict], **sections) -> dict:
    write_records(tmp_path / "in" / "p.parquet", rows)
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        tmp_path / out,
        input={"path": str(tmp_path / "in"), "id_column": "id"},
        prompt={"system": "Answer.", "template": "{body}"},
        task={"kind": "generate"},
        sampling={"max_tokens": 6},
        cache={"path": str(tmp_path / "cache")},
    )
    spec.update(sections)
    return spec


def _results(out: Path) -> dict:
    frame = pl.read_parquet(out / "results" / "*.parquet")
    return {row["id"]: row for row in frame.to_dicts()}


def _entries(tmp_path: Path) -> list[str]:
    return [k for k in open_store(str(tmp_path / "cache")).list(PREFIX) if k.endswith(".json")]


# --- item 8: a sample is never stored nor served -------------------------------------------


def test_samples_are_neither_stored_nor_served_through_jobs_run(models, tmp_path):
    rows = [{"id": f"r{i}", "body": "one ticket asked again and again"} for i in range(6)]
    rows += [{"id": f"o{i}", "body": f"another ticket {i}"} for i in range(4)]
    spec = _generate_job(
        models, tmp_path, "out-a", rows, sampling={"max_tokens": 6, "temperature": 0.7}
    )
    spec["run"] = {"engine": "fake"}
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(spec))
    first = run_cli(path)
    assert first.returncode == 0, first.stderr
    report = JobOutput(str(tmp_path / "out-a")).report()
    assert report["response_cache"]["stored"] == 0 and report["response_cache"]["hits"] == 0
    assert _entries(tmp_path) == []
    texts = [_results(tmp_path / "out-a")[f"r{i}"]["text"] for i in range(6)]
    assert len(set(texts)) > 1  # each record its own sample, none another's

    spec["output"] = {"path": str(tmp_path / "out-b")}
    path.write_text(yaml.safe_dump(spec))
    log = tmp_path / "fake.log"
    second = run_cli(path, env={"NIGHTSHIFT_FAKE_LOG": str(log)})
    assert second.returncode == 0, second.stderr
    assert len(generated_prompts(log)) == len(rows)  # nothing replayed from the cache
    assert JobOutput(str(tmp_path / "out-b")).report()["response_cache"]["hits"] == 0


def test_a_seed_or_temperature_zero_is_cached_at_job_and_record_level(models, tmp_path):
    rows = [{"id": f"r{i}", "body": f"ticket {i}", "s": None} for i in range(4)]
    rows.append({"id": "hot", "body": "a hot one", "s": '{"temperature": 0.9, "seed": null}'})
    rows.append({"id": "cold", "body": "a cold one", "s": '{"temperature": 0}'})
    sampling = {"max_tokens": 6, "temperature": 0.7, "seed": 5}
    spec = _generate_job(models, tmp_path, "out-a", rows, sampling=sampling)
    spec["input"]["sampling_column"] = "s"
    run_job(validate_spec(spec), engine=FakeEngine(), progress=False)
    engine = FakeEngine()
    again = {**spec, "output": {"path": str(tmp_path / "out-b")}}
    run_job(validate_spec(again), engine=engine, progress=False)
    assert len(engine.order) == 0  # the seed makes every answer repeatable

    unseeded = {**sampling, "seed": None}
    spec = {**spec, "sampling": unseeded, "output": {"path": str(tmp_path / "out-c")}}
    engine = FakeEngine()
    run_job(validate_spec(spec), engine=engine, progress=False)
    # the job's own sampling is a sample now; only "cold" (temperature 0) is cached
    assert len(engine.order) == len(rows) and len(_entries(tmp_path)) == len(rows) + 1
    engine = FakeEngine()
    run_job(
        validate_spec({**spec, "output": {"path": str(tmp_path / "out-d")}}),
        engine=engine,
        progress=False,
    )
    assert len(engine.order) == len(rows) - 1


def test_batch_lines_without_a_temperature_are_samples(models, tmp_path):
    """A batch job samples at temperature 1 unless a line says otherwise."""
    line = {"model": "chat", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}
    lines = [{"custom_id": f"m{i}", "params": line} for i in range(4)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cache = ["--set", f"cache.path={tmp_path / 'cache'}", "--set", "run.engine=fake"]
    args = ["--model", str(models["chat"]), *cache]
    done = batch_cli(str(source), str(tmp_path / "a.jsonl"), *args)
    assert done.returncode == 0, done.stderr
    log = tmp_path / "fake.log"
    again = batch_cli(
        str(source), str(tmp_path / "b.jsonl"), *args, env={"NIGHTSHIFT_FAKE_LOG": str(log)}
    )
    assert again.returncode == 0, again.stderr
    assert len(generated_prompts(log)) == 4 and _entries(tmp_path) == []


# --- item 11: a cached answer is the generated one, every detail ----------------------------


def test_a_cached_answer_keeps_its_stop_sequence_in_the_results(models, tmp_path):
    rows = [{"id": f"r{i}", "body": f"ticket {i}", "s": None} for i in range(5)]
    spec = _generate_job(
        models, tmp_path, "out-a", rows, sampling={"max_tokens": 6, "stop": [" w"]}
    )
    spec["input"]["sampling_column"] = "s"  # results get the detail column
    run_job(validate_spec(spec), engine=FakeEngine(), progress=False)
    engine = FakeEngine()
    run_job(
        validate_spec({**spec, "output": {"path": str(tmp_path / "out-b")}}),
        engine=engine,
        progress=False,
    )
    assert len(engine.order) == 0
    made, cached = _results(tmp_path / "out-a"), _results(tmp_path / "out-b")
    assert json.loads(made["r0"]["detail"])["choices"][0]["stop_sequence"] == " w"
    assert cached == made


def test_anthropic_batch_lines_from_the_cache_equal_the_generated_ones(models, tmp_path):
    params = {
        "model": "chat",
        "max_tokens": 6,
        "temperature": 0,
        "stop_sequences": [" w"],
        "messages": [{"role": "user", "content": "Where is my order?"}],
    }
    lines = [{"custom_id": f"m{i}", "params": {**params, "system": f"Desk {i}."}} for i in range(4)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cache = ["--set", f"cache.path={tmp_path / 'cache'}", "--set", "run.engine=fake"]
    args = ["--model", str(models["chat"]), *cache]
    done = batch_cli(str(source), str(tmp_path / "a.jsonl"), *args)
    assert done.returncode == 0, done.stderr
    log = tmp_path / "fake.log"
    again = batch_cli(
        str(source), str(tmp_path / "b.jsonl"), *args, env={"NIGHTSHIFT_FAKE_LOG": str(log)}
    )
    assert again.returncode == 0, again.stderr
    assert generated_prompts(log) == []  # every answer came from the cache
    made, cached = read_jsonl(tmp_path / "a.jsonl"), read_jsonl(tmp_path / "b.jsonl")
    message = made[0]["result"]["message"]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", " w")
    assert cached == made


def test_entries_of_the_old_layout_are_misses_and_regenerated(models, tmp_path):
    rows = [{"id": f"r{i}", "body": f"ticket {i}"} for i in range(3)]
    spec = _generate_job(models, tmp_path, "out-a", rows)
    run_job(validate_spec(spec), engine=FakeEngine(), progress=False)
    store = open_store(str(tmp_path / "cache"))
    for key in _entries(tmp_path):  # as an older nightshift wrote them: no choice detail
        entry = json.loads(store.get_bytes(key))
        digest = key.rsplit("/", 1)[1].removesuffix(".json")
        old = f"{PREFIX}{digest[:2]}/{digest}.json"
        answer = {f: entry["answer"][f] for f in ("text", *ANSWER)}
        entry |= {"key": old, "answer": answer, "sha256": responsecache._checksum(answer)}
        store.put_bytes(old, json.dumps(entry).encode())
        store.delete([key])
    assert cache_stats(str(tmp_path / "cache"))["old_layout"] == 3
    engine = FakeEngine()
    run_job(
        validate_spec({**spec, "output": {"path": str(tmp_path / "out-b")}}),
        engine=engine,
        progress=False,
    )
    assert len(engine.order) == 3 and len(_entries(tmp_path)) == 6
    assert _prune(tmp_path / "cache").returncode == 0
    assert len(_entries(tmp_path)) == 3  # the old layout's entries are pruned


# --- item 14: prune touches only entries ------------------------------------------------------


def _prune(path: Path, *args: str) -> subprocess.CompletedProcess:
    cli = [sys.executable, "-m", "nightshift.cli", "cache", "prune", str(path), *args]
    return subprocess.run(cli, capture_output=True, text=True)


def test_prune_leaves_files_that_are_not_entries(tmp_path):
    cache = ResponseCache.open(str(tmp_path / "c"), {"model": "m"})
    for i in range(3):
        cache.put([i], {**ANSWER, "text": str(i)})
    store = open_store(str(tmp_path / "c"))
    entry = store.list(PREFIX)[0]
    foreign = {
        f"{PREFIX}README.md": b"# what this folder is",
        f"{PREFIX}ab/fixture.json": b"{}",
        f"{PREFIX}ab/{'c' * 64}.json": b"{}",  # its folder is not its name's first two
        f"{PREFIX}{'0' * 64}/notes.txt": b"mine",
        entry.removesuffix(".json") + ".json.bak": b"a copy",
    }
    for key, data in foreign.items():
        store.put_bytes(key, data)
    done = _prune(tmp_path / "c", "--keep", "0")
    assert done.returncode == 0, done.stderr
    assert "deleted 3" in done.stdout
    assert sorted(store.list(PREFIX)) == sorted(foreign)
    assert cache_stats(str(tmp_path / "c"))["entries"] == 0


def test_prune_deletes_a_damaged_entry_but_no_look_alike(tmp_path):
    cache = ResponseCache.open(str(tmp_path / "c"), {"model": "m"})
    cache.put([1], {**ANSWER, "text": "one"})
    store = open_store(str(tmp_path / "c"))
    (key,) = store.list(PREFIX)
    store.put_bytes(key, b"{broken")
    store.put_bytes(f"{PREFIX}keep-me.json", b"{broken")
    done = _prune(tmp_path / "c")
    assert done.returncode == 0, done.stderr
    assert store.list(PREFIX) == [f"{PREFIX}keep-me.json"]


# --- item 19: jobs plan reads a bounded sample of this job's entries ---------------------------


class CountingStore:
    """An ObjectStore that counts what is asked of it."""

    def __init__(self, inner) -> None:
        self.inner, self.gets, self.listed = inner, [], []

    def get_bytes(self, key: str) -> bytes:
        self.gets.append(key)
        return self.inner.get_bytes(key)

    def list(self, prefix: str) -> list[str]:
        keys = self.inner.list(prefix)
        self.listed.extend(keys)
        return keys

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_jobs_plan_reads_only_a_bounded_sample_of_the_jobs_entries(models, tmp_path, monkeypatch):
    from nightshift.scheduling import cachescope
    from nightshift.scheduling.dryrun import plan_summary

    rows = [{"id": f"r{i}", "body": f"ticket number {i}"} for i in range(30)]
    spec = _generate_job(models, tmp_path, "out-a", rows)
    run_job(validate_spec(spec), engine=FakeEngine(), progress=False)
    other = ResponseCache.open(str(tmp_path / "cache"), {"model": "another one"})
    for i in range(200):  # another scope's entries: none of them is read
        other.put([i], {**ANSWER, "text": str(i)})
    mine = set(_entries(tmp_path)) - {other.key([i]) for i in range(200)}
    assert len(mine) == 30

    counting: list[CountingStore] = []

    def opened(location: str):
        counting.append(CountingStore(open_store(location)))
        return counting[-1]

    monkeypatch.setattr(responsecache, "open_store", opened)
    spec = validate_spec({**spec, "output": {"path": str(tmp_path / "out-b")}})
    spec = spec.model_copy(
        update={"cost": spec.cost.model_copy(update={"expected_tokens_per_s": 100.0})}
    )
    assert "a sample of 30 answers in cache.path" in plan_summary(spec)["projection"]["note"]
    (store,) = counting
    assert set(store.gets) == mine and len(store.gets) == 30
    assert set(store.listed) <= mine  # the listing names only this job's entries

    monkeypatch.setattr(cachescope, "SAMPLE_ANSWERS", 7)
    counting.clear()
    assert "a sample of 7 answers" in plan_summary(spec)["projection"]["note"]
    assert len(counting[0].gets) == 7
