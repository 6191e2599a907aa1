"""Batch output usage for requests answered once for several lines (dedup copies), and
message fields nightshift cannot honour (``name``...): refused per line, never dropped."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types.chat import ChatCompletion

from nightshift.engines.fake import FakeEngine
from nightshift.io.outputs import JobOutput, committed_files
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .batchlines import CTX
from .conftest import spec_dict, write_records
from .durable import generated_prompts, read_table

NIGHTSHIFT = [sys.executable, "-m", "nightshift.cli"]
SYSTEM = "You are the support desk of Example Corp. Answer briefly and politely."


def batch_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    limit = {"NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}"}
    return subprocess.run(
        [*NIGHTSHIFT, "batch", "run", *args, "--set", "run.engine=fake", "-q"],
        env={**os.environ, **limit, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def chat(custom_id: str, text: str, **message) -> dict:
    turns = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text, **message}]
    body = {"model": "chat", "messages": turns, "max_tokens": 8, "temperature": 0}
    return {"custom_id": custom_id, "method": "POST", "url": CTX.endpoint, "body": body}


def anthropic(custom_id: str, text: str) -> dict:
    params = {
        "model": "chat",
        "max_tokens": 8,
        "temperature": 0,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": text}],
    }
    return {"custom_id": custom_id, "params": params}


def run(tmp_path: Path, models, lines: list[dict]) -> tuple[dict, str, list[str]]:
    """Every output and error line by custom_id, the CLI's summary, the prompts generated."""
    source, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    log = tmp_path / "fake.log"
    done = batch_cli(
        str(source), str(out), "--model", str(models["chat"]), env={"NIGHTSHIFT_FAKE_LOG": str(log)}
    )
    assert done.returncode == 0, done.stderr
    files = [out, tmp_path / "results.errors.jsonl"]
    read = [json.loads(x) for f in files if f.exists() for x in f.read_text().splitlines()]
    return {x["custom_id"]: x for x in read}, done.stdout, generated_prompts(log)


def summary(stdout: str) -> tuple[int, int, int]:
    found = re.search(r"tokens: ([\d,]+) in \(([\d,]+) cached\), ([\d,]+) out", stdout)
    assert found, stdout
    return tuple(int(g.replace(",", "")) for g in found.groups())


def test_a_repeated_openai_request_reports_its_own_usage(models, tmp_path):
    texts = ["my invoice is wrong", "the app crashes on start", "my invoice is wrong"]
    lines = [chat(f"r{i}", t) for i, t in enumerate(texts)] + [chat("r3", texts[1])]
    by_id, stdout, sent = run(tmp_path, models, lines)
    assert len(sent) == 2  # r2 and r3 repeat r0 and r1: answered once each
    usage = {
        k: ChatCompletion.model_validate(v["response"]["body"]).usage for k, v in by_id.items()
    }
    for copy, original in (("r2", "r0"), ("r3", "r1")):
        mine, theirs = usage[copy], usage[original]
        assert mine.prompt_tokens == theirs.prompt_tokens > 0
        assert mine.completion_tokens == theirs.completion_tokens > 0
        assert mine.total_tokens == mine.prompt_tokens + mine.completion_tokens
        # a copy never reached the engine: nothing of its prompt was read from a cache
        assert mine.prompt_tokens_details.cached_tokens == 0
        text = by_id[copy]["response"]["body"]["choices"][0]["message"]["content"]
        assert text == by_id[original]["response"]["body"]["choices"][0]["message"]["content"]
    # the batch's usage is the sum of its lines'
    assert summary(stdout) == (
        sum(u.prompt_tokens for u in usage.values()),
        sum(u.prompt_tokens_details.cached_tokens for u in usage.values()),
        sum(u.completion_tokens for u in usage.values()),
    )


def test_a_repeated_anthropic_request_reports_its_own_usage(models, tmp_path):
    lines = [anthropic("a", "refund please"), anthropic("b", "refund please")]
    by_id, stdout, sent = run(tmp_path, models, lines)
    assert len(sent) == 1
    results = {k: MessageBatchIndividualResponse.model_validate(v) for k, v in by_id.items()}
    original, copy = results["a"].result.message, results["b"].result.message
    prompt = original.usage.input_tokens + original.usage.cache_read_input_tokens
    assert copy.usage.input_tokens == prompt > 0
    assert copy.usage.cache_read_input_tokens == 0 and copy.usage.cache_creation_input_tokens == 0
    assert copy.usage.output_tokens == original.usage.output_tokens > 0
    in_, cached, out = summary(stdout)
    assert in_ == 2 * prompt and out == 2 * original.usage.output_tokens
    assert cached == original.usage.cache_read_input_tokens


def test_a_message_name_is_refused_on_its_line_and_the_others_run(models, tmp_path):
    lines = [
        chat("plain", "hello there"),
        chat("named", "hello there", name="alice"),
        chat("refusal", "hello there", refusal="no"),
        chat("audio", "hello there", audio={"id": "x"}),
    ]
    by_id, _, sent = run(tmp_path, models, lines)
    assert len(sent) == 1  # only "plain": the named request is never merged with it
    assert by_id["plain"]["response"]["status_code"] == 200
    for custom_id, key in (("named", "name"), ("refusal", "refusal"), ("audio", "audio")):
        response = by_id[custom_id]["response"]
        assert response["status_code"] == 400, by_id[custom_id]
        error = response["body"]["error"]
        assert error["code"] == "unsupported_parameter"
        assert error["param"] == f"messages[1].{key}" and key in error["message"]


def test_extra_keys_of_a_text_part_are_refused(models, tmp_path):
    part = {"type": "text", "text": "hi", "detail": "high"}
    line = chat("part", "x")
    line["body"]["messages"][1]["content"] = [part]
    by_id, _, _ = run(tmp_path, models, [line, chat("ok", "hi")])
    error = by_id["part"]["response"]["body"]["error"]
    assert error["param"] == "messages[1].content[0].detail"
    assert by_id["ok"]["response"]["status_code"] == 200


def test_a_conversation_turn_with_a_name_is_rejected_not_dropped(models, tmp_path):
    fields = [("role", pa.string()), ("content", pa.string()), ("name", pa.string())]
    schema = pa.schema([("cid", pa.string()), ("messages", pa.list_(pa.struct(fields)))])
    rows = [
        {"cid": "plain", "messages": [{"role": "user", "content": "hi", "name": None}]},
        {"cid": "named", "messages": [{"role": "user", "content": "hi", "name": "alice"}]},
    ]
    write_records(tmp_path / "in" / "c.parquet", rows, schema)
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        tmp_path / "out",
        input={"path": str(tmp_path / "in"), "id_column": "cid"},
        prompt={"messages_column": "messages"},
        task={"kind": "generate"},
    )
    sent: list[list[int]] = []
    engine = FakeEngine(fail_when=lambda ids: sent.append(list(ids)))
    report = run_job(validate_spec(spec), engine=engine, progress=False).report
    assert report["records"]["ok"] == 1 and len(sent) == 1  # "named" is no copy of "plain"
    output = JobOutput(str(tmp_path / "out"))
    (uri,) = committed_files(output.location, "rejects")
    rejects = read_table(output, uri).to_pylist()
    assert [(r["cid"], r["reject_kind"]) for r in rejects] == [("named", "unsupported_field")]
    assert "name" in rejects[0]["reason"]


def test_answers_from_the_response_cache_report_their_request_usage(models, tmp_path):
    """A cached answer's line reports its prompt and answer tokens as when generated."""
    cache = ["--set", f"cache.path={tmp_path / 'cache'}"]
    lines = [chat("c0", "where is my parcel"), chat("c1", "cancel my order")]
    usage = []
    for night in ("first", "second"):
        folder = tmp_path / night
        folder.mkdir()
        (folder / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        log = folder / "fake.log"
        out = folder / "results.jsonl"
        args = [str(folder / "requests.jsonl"), str(out), "--model", str(models["chat"])]
        done = batch_cli(*args, *cache, env={"NIGHTSHIFT_FAKE_LOG": str(log)})
        assert done.returncode == 0, done.stderr
        bodies = [json.loads(x)["response"]["body"] for x in out.read_text().splitlines()]
        usage.append([ChatCompletion.model_validate(b).usage for b in bodies])
    assert generated_prompts(tmp_path / "second" / "fake.log") == []  # all from the cache
    for cached, generated in zip(usage[1], usage[0], strict=True):
        assert cached.prompt_tokens == generated.prompt_tokens > 0
        assert cached.completion_tokens == generated.completion_tokens > 0
        assert cached.total_tokens == cached.prompt_tokens + cached.completion_tokens
