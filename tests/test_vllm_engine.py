"""The real engine: vLLM on the demo model, through the same job path users run.

One engine is started for the module, in the test's own process (tests/inprocess.py), and
shared by the jobs; test_vllm_cli starts its own, as a user's command would.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import polars as pl
import pytest

from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict
from .inprocess import vllm_in_this_process
from .test_record_sampling import SCHEMA as SAMPLING_SCHEMA
from .test_record_sampling import _detail, _job, _results

pytestmark = [pytest.mark.engine, pytest.mark.engine_in_process]

LABELS = ["billing", "bug", "feature_request", "account", "other"]
SCHEMA = {
    "type": "object",
    "properties": {
        "priority": {"enum": ["low", "medium", "high"]},
        "needs_refund": {"type": "boolean"},
        "product": {"enum": ["app", "billing", "api"]},
    },
    "required": ["priority", "needs_refund", "product"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(models, tmp_path_factory):
    from nightshift.running.engines import start_vllm

    data = spec_dict(models["chat"], "unused", tmp_path_factory.mktemp("o"))
    # dtype and eager mode left to the platform, as the shipped configs leave them
    data["model"]["dtype"], data["engine"] = "auto", {"max_num_seqs": 64}
    with vllm_in_this_process():  # one engine for the module, started in 3 s
        engine = start_vllm(validate_spec(data))
    yield engine
    engine.close()


def run(models, ticket_dir, out, engine, **sections):
    spec = validate_spec(spec_dict(models["chat"], ticket_dir, out, **sections))
    return run_job(spec, engine=engine, progress=False)


def read_results(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "results" / "*.parquet")


def test_fp8_kv_cache_is_in_effect_where_the_hardware_has_it(engine):
    from nightshift.engines.vllm_engine import fp8_kv_unsupported_reason

    reason = fp8_kv_unsupported_reason()
    settings = engine.info.settings
    if reason is None and "kv_cache_fallback" in settings:
        # The CPU has the instructions but vLLM still refused: say so loudly in the run.
        pytest.xfail(f"FP8 KV fell back on capable hardware: {settings['kv_cache_fallback']}")
    if reason is None:
        assert engine.info.kv_cache_dtype.startswith("fp8")
    else:
        # Never silently: the fallback and its reason travel into every report.
        assert engine.info.kv_cache_dtype == "auto"
        assert settings["kv_cache_dtype_requested"] == "fp8"
        assert settings["kv_cache_fallback"] == reason
    assert engine.info.prefix_caching and engine.info.kv_cache_tokens > 0


def test_the_cpu_gets_eager_and_a_dtype_it_runs_and_the_report_says_so(engine):
    import torch

    chose, settings = engine.info.settings["chosen"], engine.info.settings
    bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert chose["enforce_eager"] is True and "enforce_eager" in settings["platform_choices"]
    if not bf16:  # no bf16 units: float32 picked for "auto", with its reason
        assert chose["dtype"] == "float32" and "dtype" in settings["platform_choices"]
    assert chose["max_num_seqs"] == 64  # the spec's, where it sets one
    assert chose["max_num_batched_tokens"] > 0 and chose["block_size"] == engine.info.block_size


def test_classify_returns_only_labels_and_reconciles(models, ticket_dir, tmp_path, engine):
    outcome = run(models, ticket_dir, tmp_path / "out", engine, run={"chunk_records": 50})
    results = read_results(tmp_path / "out")
    assert len(results) == 120 and results["ticket_id"].n_unique() == 120
    assert set(results["label"]) <= set(LABELS)
    report = outcome.report
    records = report["records"]
    assert records["input"] == records["ok"] + records["rejected"] + records["failed"] == 120
    # Totals come from the engine's per-record counts and match the engine's own counters.
    tokens, counters = report["tokens"], report["engine"]["counters"]
    assert tokens["prompt"] == results["prompt_tokens"].sum() == counters["prompt_tokens"]
    assert tokens["output"] == results["output_tokens"].sum() == counters["output_tokens"]
    assert tokens["prompt_cached"] == results["cached_tokens"].sum()
    assert report["engine"]["kv_cache_dtype"] == engine.info.kv_cache_dtype


def test_extract_returns_json_that_validates(models, ticket_dir, tmp_path, engine):
    outcome = run(
        models,
        ticket_dir,
        tmp_path / "out",
        engine,
        task={"kind": "extract", "schema": SCHEMA},
        sampling={"max_tokens": 48},
    )
    results = read_results(tmp_path / "out")
    failed = pl.read_parquet(tmp_path / "out" / "failed" / "*.parquet")
    # A random model may wander until max_tokens; such a record fails with its reason and
    # text kept. Every answer that is reported ok validates against the schema.
    assert outcome.report["records"]["ok"] == len(results) >= 100
    assert len(results) + len(failed) == 120
    assert (failed["finish_reason"] == "length").all()
    assert all("cut off by sampling.max_tokens" in e for e in failed["error"])
    for value in results["json"]:
        jsonschema.validate(json.loads(value), SCHEMA)


def test_rejects_and_prompt_caching_on_the_real_engine(models, tmp_path, engine):
    from .conftest import write_records

    shared = "Shared preamble. " * 120  # several whole KV blocks every prompt starts with
    rows = [{"ticket_id": f"r{i}", "subject": "s", "body": f"question {i}"} for i in range(20)]
    rows.append({"ticket_id": "long", "subject": "s", "body": "word " * 3000})
    write_records(tmp_path / "in.parquet", rows)
    outcome = run(
        models,
        tmp_path / "in.parquet",
        tmp_path / "out",
        engine,
        prompt={"system": shared, "template": "{subject}: {body}"},
    )
    report = outcome.report
    assert report["records"] == {
        "input": 21,
        "ok": 20,
        "rejected": 1,
        "failed": 0,
        "not_yet_run": 0,
    }
    assert pl.read_parquet(tmp_path / "out" / "rejects.parquet")["ticket_id"].to_list() == ["long"]
    block = engine.info.block_size
    assert report["tokens"]["prompt_cached"] >= 19 * block  # all but the first reuse the preamble
    assert report["prefix_cache_hit_rate"] > 0


def test_a_prompt_vllm_refuses_fails_alone_and_results_stream_by_key(engine):
    from nightshift.engines.base import EngineRequest, Sampling

    good = [0] + list(range(10, 40))
    requests = [EngineRequest(0, good), EngineRequest(1, [0, 10**6]), EngineRequest(2, good[:-3])]
    results = {r.key: r for r in engine.run(requests, Sampling(max_tokens=4))}
    assert sorted(results) == [0, 1, 2]
    assert "vocab" in results[1].error and results[1].output_tokens == 0
    assert results[0].error is None and results[0].prompt_tokens == len(good)
    assert results[2].error is None and 0 < results[2].output_tokens <= 4


def test_score_tokens_come_back_as_the_first_places_log_probabilities(engine):
    """Label scoring (classify): each score is the log probability of its token at the
    answer's first place, in the order asked (the greedy token's is the one vLLM gives
    its own logprobs); a request without score tokens has none."""
    from nightshift.engines.base import EngineRequest, Sampling

    prompt = [0] + list(range(10, 40))
    [plain] = engine.run([EngineRequest(0, prompt)], Sampling(max_tokens=1, logprobs=0))
    assert plain.scores is None
    [greedy] = engine._llm.get_tokenizer().encode(plain.text, add_special_tokens=False)
    tokens = (*[t for t in range(5, 40) if t != greedy], greedy)
    [scored] = engine.run([EngineRequest(1, prompt)], Sampling(1, score_tokens=tokens))
    assert len(scored.scores) == len(tokens) and all(s <= 0 for s in scored.scores)
    assert sum(math.exp(s) for s in scored.scores) <= 1 + 1e-5
    assert scored.scores[-1] == max(scored.scores)  # greedy: the likeliest token
    assert scored.scores[-1] == pytest.approx(plain.choices[0].logprobs[0].logprob, abs=1e-4)


def test_the_prefix_cache_serves_what_the_plan_predicted(models, engine, tmp_path):
    from .conftest import write_records
    from .questions import document

    # 8 documents of 125-455 tokens, 6 questions each, interleaved: the plan groups them.
    rows = [
        {"qid": f"d{d}-q{q}", "document": document(d), "question": f"Why {q}? " * (q + 1)}
        for q in range(6)
        for d in range(8)
    ]
    write_records(tmp_path / "in" / "q.parquet", rows)
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        tmp_path / "out",
        input={"path": str(tmp_path / "in"), "id_column": "qid"},
        prompt={"system": "Answer briefly.", "template": "{document}\n\nQuestion: {question}"},
        task={"kind": "generate"},
    )
    report = run_job(validate_spec(spec), engine=engine, progress=False).report
    reuse = report["prefix_reuse"]
    assert reuse["block_size"] == report["engine"]["block_size"] == 128
    assert reuse["predicted"] > 0.4
    # Stated tolerance: within 2 percentage points of the prediction.
    assert reuse["measured"] == pytest.approx(reuse["predicted"], abs=0.02)


def test_the_prediction_holds_for_a_single_column_and_for_conversations(models, engine, tmp_path):
    import pyarrow as pa

    from .conftest import write_records
    from .questions import document

    # The shared document ends inside the field: pre-rendered in one column, and inside
    # the user turn of a conversation that opens with a shared few-shot exchange.
    asks = [(d, q) for q in range(6) for d in range(8)]  # interleaved
    column = [
        {
            "qid": f"d{d}-q{q}",
            "prompt": f"Read.\n\n{document(d)}\n\nQuestion: " + f"why {q}? " * (q + 1),
        }
        for d, q in asks
    ]
    few_shot = [
        {"role": "user", "content": "Example document.\n\nQuestion: what is it?"},
        {"role": "assistant", "content": "An example."},
    ]
    chats = [
        {
            "qid": r["qid"],
            "messages": [
                *few_shot,
                {"role": "user", "content": r["prompt"].removeprefix("Read.\n\n")},
            ],
        }
        for r in column
    ]
    turn = pa.struct([("role", pa.string()), ("content", pa.string())])
    shapes = {
        "column": ({"template": "{prompt}"}, column, None),
        "messages": (
            {"messages_column": "messages"},
            chats,
            pa.schema([("qid", pa.string()), ("messages", pa.list_(turn))]),
        ),
    }
    for name, (prompt, rows, schema) in shapes.items():
        write_records(tmp_path / name / "in.parquet", rows, schema)
        spec = spec_dict(
            models["chat"],
            tmp_path / name / "in.parquet",
            tmp_path / name / "out",
            input={"path": str(tmp_path / name / "in.parquet"), "id_column": "qid"},
            prompt={"system": "Answer briefly.", **prompt},
            task={"kind": "generate"},
        )
        report = run_job(validate_spec(spec), engine=engine, progress=False).report
        reuse = report["prefix_reuse"]
        assert reuse["block_size"] == 128 and reuse["predicted"] > 0.4, name
        assert reuse["measured"] == pytest.approx(reuse["predicted"], abs=0.02), name


# The killed-engine test runs through the Prefect flow: tests/test_pipelines.py.


def test_vllm_honours_per_record_sampling_and_raw_prompts(models, tmp_path, engine):
    """Per-record max_tokens, a JSON schema, n=2 and logprobs (``input.sampling_column``);
    then a raw-text prompt (``prompt.chat_template: false``)."""
    from transformers import AutoTokenizer

    values = {
        "short": '{"max_tokens": 2}',
        "schema": json.dumps({"json_schema": SAMPLING_SCHEMA, "max_tokens": 40}),
        "two": '{"n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 6}',
        "logprobs": '{"logprobs": true, "top_logprobs": 2, "max_tokens": 3}',
    }
    rows = [{"id": k, "body": f"ticket {k}: the app crashes", "s": v} for k, v in values.items()]
    run_job(validate_spec(_job(models, tmp_path, rows)), engine=engine, progress=False)
    results = _results(tmp_path / "out")
    assert results["short"]["output_tokens"] <= 2
    assert json.loads(results["schema"]["text"])["priority"] in {"low", "high"}
    two = _detail(results["two"])
    assert len(two) == 2
    assert results["two"]["output_tokens"] == sum(c["output_tokens"] for c in two)
    logprobs = _detail(results["logprobs"])[0]["logprobs"]
    assert len(logprobs) == results["logprobs"]["output_tokens"]
    assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in logprobs)
    assert "".join(t["token"] for t in logprobs) == results["logprobs"]["text"]

    raw = tmp_path / "raw"
    job = _job(models, raw, rows[:1], prompt={"template": "{body}", "chat_template": False})
    run_job(validate_spec(job), engine=engine, progress=False)
    row = _results(raw / "out")["short"]
    tok = AutoTokenizer.from_pretrained(str(models["chat"]))
    assert row["prompt_tokens"] == len(tok(rows[0]["body"])["input_ids"])
