"""Per-record sampling (``input.sampling_column``) and raw prompts (``prompt.chat_template:
false``), through the path users run: plan, feed, engine, results."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.errors import SpecError, SpecErrors
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records

SCHEMA = {
    "type": "object",
    "properties": {"priority": {"enum": ["low", "high"]}},
    "required": ["priority"],
    "additionalProperties": False,
}


class Recording(FakeEngine):
    """A fake engine that keeps each request's own sampling, by its prompt's first id."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seen: list = []

    def _one(self, request, sampling):
        self.seen.append(request.sampling)
        return super()._one(request, sampling)


def _job(models, tmp_path: Path, rows: list[dict], **sections) -> dict:
    write_records(tmp_path / "in" / "part-0.parquet", rows)
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        tmp_path / "out",
        input={"path": str(tmp_path / "in"), "id_column": "id", "sampling_column": "s"},
        prompt={"system": "Answer.", "template": "{body}"},
        task={"kind": "generate"},
        sampling={"max_tokens": 8},
    )
    spec.update(sections)
    return spec


def _results(out: Path) -> dict:
    frame = pl.read_parquet(out / "results" / "*.parquet")
    return {row["id"]: row for row in frame.to_dicts()}


def _rejects(out: Path) -> dict:
    frame = pl.read_parquet(out / "rejects.parquet")
    return {row["id"]: row for row in frame.to_dicts()}


def _detail(row: dict) -> list[dict]:
    return json.loads(row["detail"])["choices"]


def test_each_record_runs_under_its_own_sampling_and_bad_values_reject_alone(models, tmp_path):
    values = {
        "plain": None,
        "short": '{"max_tokens": 3}',
        "stop": '{"stop": [" "]}',
        "three": '{"n": 3, "temperature": 0.8, "max_tokens": 2}',
        "json": '{"json_object": true}',
        "schema": json.dumps({"json_schema": SCHEMA}),
        "logprobs": '{"logprobs": true, "top_logprobs": 2, "max_tokens": 2}',
        "broken": "{max_tokens: 3",
        "deep": "[" * 100_000,  # past the JSON parser's recursion: this record's problem
        "zero_n": '{"n": 0}',
        "unknown": '{"max_token": 3}',
        "both": '{"json_object": true, "json_schema": {"type": "object"}}',
        "too_long": '{"max_tokens": 2040}',  # prompt + its own max_tokens > 2048
    }
    rows = [{"id": k, "body": f"ticket {k} body text", "s": v} for k, v in values.items()]
    engine = Recording()
    run_job(validate_spec(_job(models, tmp_path, rows)), engine=engine, progress=False)
    out = tmp_path / "out"
    results, rejects = _results(out), _rejects(out)

    assert set(results) == {"plain", "short", "stop", "three", "json", "schema", "logprobs"}
    assert len(results["plain"]["text"].split()) == 8  # the job's max_tokens
    assert len(results["short"]["text"].split()) == 3  # its own
    assert results["short"]["output_tokens"] == 3
    stop = _detail(results["stop"])[0]
    assert stop["finish_reason"] == "stop" and stop["stop_sequence"] == " "
    assert " " not in results["stop"]["text"]
    three = _detail(results["three"])
    assert len(three) == 3 and len({c["text"] for c in three}) == 3  # sampled apart
    assert results["three"]["output_tokens"] == sum(c["output_tokens"] for c in three)
    assert three[0]["text"] == results["three"]["text"]  # choice 0 is the row's own
    assert isinstance(json.loads(results["json"]["text"]), dict)
    assert json.loads(results["schema"]["text"])["priority"] in {"low", "high"}
    logprobs = _detail(results["logprobs"])[0]["logprobs"]
    assert len(logprobs) == 2 and all(len(t["top_logprobs"]) == 2 for t in logprobs)
    assert logprobs[0]["bytes"] == list(logprobs[0]["token"].encode())
    assert _detail(results["plain"])[0]["logprobs"] is None

    assert {k: r["reject_kind"] for k, r in rejects.items()} == {
        "broken": "bad_sampling",
        "deep": "bad_sampling",
        "zero_n": "bad_sampling",
        "unknown": "bad_sampling",
        "both": "bad_sampling",
        "too_long": "over_length",
    }
    assert "not JSON" in rejects["broken"]["reason"]
    assert "nested too deeply" in rejects["deep"]["reason"]
    assert "sampling n:" in rejects["zero_n"]["reason"]
    assert "'max_token' is not known" in rejects["unknown"]["reason"]
    assert "json_schema and json_object" in rejects["both"]["reason"]
    assert "2040 answer tokens (its own max_tokens)" in rejects["too_long"]["reason"]
    # the engine got each record's merged sampling, the job's where it set nothing
    assert sorted(s.max_tokens for s in engine.seen) == [2, 2, 3, 8, 8, 8, 8]


def test_dedup_and_the_cache_keep_apart_records_that_differ_only_in_sampling(models, tmp_path):
    same = "one shared ticket body"
    values = ['{"max_tokens": 4}', '{"max_tokens": 4}', '{"max_tokens": 5}', None]
    values += ['{"temperature": 0.9}', '{"temperature": 0.9}']  # samples: never merged
    values += ['{"n": 2}']  # deterministic, but n > 1 is never cached
    rows = [{"id": f"r{i}", "body": same, "s": v} for i, v in enumerate(values)]
    cache = str(tmp_path / "cache")
    spec = _job(models, tmp_path, rows, cache={"path": cache})
    engine = FakeEngine()
    run_job(validate_spec(spec), engine=engine, progress=False)
    # r1 repeats r0 (same prompt, same sampling); every other record is its own request
    assert len(engine.order) == len(values) - 1
    results = _results(tmp_path / "out")
    assert results["r1"]["answered_from"] == "r0"
    assert all(results[f"r{i}"]["answered_from"] is None for i in (2, 3, 4, 5, 6))
    assert len(results["r0"]["text"].split()) == 4 and len(results["r2"]["text"].split()) == 5

    # A second job on the same cache: deterministic single answers come from it, each
    # under its own sampling; samples and n > 1 are generated again.
    again = {**spec, "output": {"path": str(tmp_path / "out2")}}
    engine = FakeEngine()
    run_job(validate_spec(again), engine=engine, progress=False)
    assert len(engine.order) == 3  # r4, r5 (temperature 0.9, no seed) and r6 (n 2)
    cached = _results(tmp_path / "out2")
    assert cached["r2"]["text"] == results["r2"]["text"] != cached["r0"]["text"]


def test_a_job_without_the_new_keys_is_unchanged(models, tmp_path):
    """Same fingerprint and cache scope as before the keys existed, and no detail column."""
    from nightshift.engines.identity import engine_identity
    from nightshift.io.responsecache import scope_digest
    from nightshift.jobs.fingerprint import fingerprint, plan_stamp
    from nightshift.jobs.tasks import handler_for, sampling_for
    from nightshift.scheduling.cachescope import cache_scope

    data = spec_dict("example-org/no-such-model", "/in", Path("/out"))
    data["sampling"] = {"max_tokens": 8, "stop": ["\n"]}
    spec = validate_spec(data)
    inputs = dict(plan_stamp(spec)["fingerprint_inputs"])
    sampling = sampling_for(spec, handler_for(spec.task))
    # The engine and its version were added on purpose (an upgrade changes answers; a
    # plan without them still resumes): the rest is as nightshift computed it before
    # input.sampling_column and prompt.chat_template.
    assert inputs.pop("engine") == engine_identity(spec.run.engine)
    assert fingerprint(inputs) == "b922451cf525b76b"
    assert scope_digest(cache_scope(inputs, sampling)) == (
        "7d04a89d6e39c966b176d080e1a954f82075d1990d6a959362cfb36900eb333d"
    )
    rows = [{"id": "a", "body": "some ticket", "s": '{"max_tokens": 2}'}]
    job = _job(models, tmp_path, rows)
    job["input"] = {"path": job["input"]["path"], "id_column": "id"}
    run_job(validate_spec(job), engine=FakeEngine(), progress=False)
    row = _results(tmp_path / "out")["a"]
    assert "detail" not in row and len(row["text"].split()) == 8  # the column is not read


def test_raw_prompts_have_no_chat_frame(models, tmp_path):
    from transformers import AutoTokenizer

    body = "Subject: refund\n\nplease help {not a field}"
    rows = [{"id": "a", "body": body, "s": None}]
    job = _job(models, tmp_path, rows, prompt={"template": "{body}", "chat_template": False})
    run_job(validate_spec(job), engine=FakeEngine(), progress=False)
    tok = AutoTokenizer.from_pretrained(str(models["chat"]))
    expected = tok(body, add_special_tokens=True)["input_ids"]
    assert _results(tmp_path / "out")["a"]["prompt_tokens"] == len(expected)

    job["prompt"] = {"system": "Answer.", "template": "{body}", "chat_template": False}
    with pytest.raises(SpecErrors, match="chat_template"):
        validate_spec(job)


def test_a_sampling_column_that_is_not_text_is_refused(models, tmp_path):
    rows = [{"id": "a", "body": "b", "s": 3}]
    with pytest.raises(SpecError, match="input.sampling_column"):
        run_job(validate_spec(_job(models, tmp_path, rows)), engine=FakeEngine(), progress=False)


def test_the_fake_engines_n_samples_of_a_request_always_differ():
    """The fake engine draws once per request and adds the choice's index, so n unseeded
    samples never repeat each other (a draw per choice did, about one run in 700)."""
    from nightshift.engines.base import EngineRequest, Sampling

    engine, sampling = FakeEngine(), Sampling(n=3, temperature=0.8, max_tokens=2)
    requests = [EngineRequest(key, [1, 2, key % 50]) for key in range(2000)]
    for result in engine.run(requests, sampling):
        assert len({c.text for c in result.choices}) == 3, result.key
    seeded = Sampling(n=2, temperature=0.8, max_tokens=2, seed=4)
    first, again = engine.run([EngineRequest(k, [9]) for k in (0, 1)], seeded)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
