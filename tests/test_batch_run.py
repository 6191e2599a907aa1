"""``nightshift batch run`` end to end: the CLI on the fake engine for both formats, a
kill and a resume, S3 in and out, the mistakes a user can make, and one real-engine run
killed after its first checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types import Completion
from openai.types.chat import ChatCompletion

from nightshift.batch.run import run_batch
from nightshift.errors import SpecError, UserError

from .durable import generated_prompts, kill_alone, start_until_checkpoint

pytest_plugins = ["tests.s3server"]

NIGHTSHIFT = [sys.executable, "-m", "nightshift.cli"]
FAKE = ["--set", "run.engine=fake"]
SYSTEM = "You are the support desk of Example Corp. Answer briefly and politely."
SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["billing", "bug", "other"]}},
    "required": ["label"],
    "additionalProperties": False,
}


def batch_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    limit = {"NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}"}
    return subprocess.run(
        [*NIGHTSHIFT, "batch", "run", *args, "-q"],
        env={**os.environ, **limit, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def chat_line(custom_id: str, text: str, **body) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    body = {"model": "chat", "messages": messages, "max_tokens": 8, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def openai_file(path: Path, good: int = 24) -> tuple[list[str], int]:
    """``good`` runnable requests (a shared system text, JSON-schema ones, text with
    braces and Jinja) and bad lines; the good ids and the number of bad lines."""
    lines = []
    for i in range(good):
        text = f"Ticket {i}: my {{invoice}} shows {{{{ total }}}} {'{% if x %}' if i % 3 else ''}"
        extra = {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "t", "schema": SCHEMA},
            }
        }
        lines.append(chat_line(f"req-{i}", text, **(extra if i % 4 == 0 else {})))
    bad = [
        "{not json",
        {"method": "POST", "url": "/v1/chat/completions", "body": {}},
        chat_line("req-0", "a repeat"),
        chat_line("bad-stream", "x", stream=True),
        chat_line("bad-tools", "x", tools=[{"type": "function"}]),
        chat_line("bad-model", "x", model="gpt-4o"),
        {**chat_line("bad-url", "x"), "url": "/v1/embeddings"},
        chat_line("too-long", "word " * 3000),
    ]
    every = lines[:5] + bad[:4] + lines[5:] + bad[4:]
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in every))
    return [line["custom_id"] for line in lines], len(bad)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_each_once(out: Path, errors: Path, good: list[str], bad: int) -> list[dict]:
    answered, failed = read_jsonl(out), read_jsonl(errors)
    ids = [x["custom_id"] for x in answered + failed]
    named = [i for i in ids if i is not None]
    assert len(named) == len(set(named)) + 1  # req-0's repeat is the one error line sharing it
    assert set(good) <= set(named)
    assert len(answered) + len(failed) == len(good) + bad
    for line in answered:
        assert line["error"] is None and line["response"]["status_code"] == 200
        ChatCompletion.model_validate(line["response"]["body"])
    return failed


def test_an_openai_batch_killed_midway_resumes_and_a_rerun_writes_the_same_bytes(models, tmp_path):
    source, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    good, bad = openai_file(source)
    args = [str(source), str(out), "--model", str(models["chat"]), *FAKE]
    small = ["--set", "run.chunk_records=4", "--set", "plan.shard_records=8"]
    # the third chunk: shard 1's first, after shard 0's two (the second checkpointed as
    # shard 0 went to its commit)
    first = batch_cli(*args, *small, env={"NIGHTSHIFT_CRASH_AT": "chunk.written:3"})
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert not out.exists()  # written only once the job is done
    log = tmp_path / "fake.log"
    second = batch_cli(*args, *small, env={"NIGHTSHIFT_FAKE_LOG": str(log)})
    assert second.returncode == 0, second.stderr
    assert len(generated_prompts(log)) <= len(good) - 8  # two chunks of 4 were kept
    assert "completed" in second.stdout and "Traceback" not in second.stderr
    errors = tmp_path / "results.errors.jsonl"
    failed = assert_each_once(out, errors, good, bad)
    codes = {
        (f["custom_id"], (f["response"] or {}).get("body", {}).get("error", {}).get("code"))
        for f in failed
    }
    assert ("too-long", "context_length_exceeded") in codes
    assert ("bad-model", "model_not_found") in codes and (
        "bad-stream",
        "unsupported_parameter",
    ) in codes
    assert (None, "missing_custom_id") in codes and (None, "invalid_json") in codes
    answered = read_jsonl(out)
    assert [x["custom_id"] for x in answered] == sorted(good, key=lambda c: int(c.split("-")[1]))
    for line in answered:
        if int(line["custom_id"].split("-")[1]) % 4 == 0:
            assert json.loads(line["response"]["body"]["choices"][0]["message"]["content"])["label"]
    before = out.read_bytes(), errors.read_bytes()
    third = batch_cli(*args, *small)
    assert third.returncode == 0, third.stderr
    assert (out.read_bytes(), errors.read_bytes()) == before
    assert (tmp_path / "results.jsonl.nightshift" / "batch.json").is_file()


def test_an_anthropic_batch_through_the_cli(models, tmp_path):
    params = {
        "model": "chat",
        "max_tokens": 6,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "Where is my {order}?"}],
        "stop_sequences": ["\n\n"],
    }
    lines = [{"custom_id": f"m{i}", "params": {**params, "temperature": 0.1 * i}} for i in range(5)]
    lines.append({"custom_id": "m9", "params": {**params, "tools": [{"name": "x"}]}})
    source, out = tmp_path / "messages.jsonl", tmp_path / "results.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = batch_cli(str(source), str(out), "--model", str(models["chat"]), *FAKE)
    assert done.returncode == 0, done.stderr
    results = [MessageBatchIndividualResponse.model_validate(x) for x in read_jsonl(out)]
    assert [r.custom_id for r in results] == ["m0", "m1", "m2", "m3", "m4", "m9"]
    assert [r.result.type for r in results] == ["succeeded"] * 5 + ["errored"]
    assert results[0].result.message.model == "chat"
    assert not (tmp_path / "results.errors.jsonl").exists()  # Anthropic: one results file


def test_a_completions_batch_in_process_and_the_mistakes_a_user_can_make(models, tmp_path):
    lines = [
        {
            "custom_id": f"p{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": f"{{x}} {i}", "max_tokens": 5, "n": 1 + i % 2},
        }
        for i in range(6)
    ]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    outcome = run_batch(
        str(source),
        str(out),
        model=str(models["plain"]),
        served_names=["base", "alias"],
        overrides=["run.engine=fake"],
    )
    assert (outcome.total, outcome.completed, outcome.failed) == (6, 6, 0)
    assert outcome.input_tokens > 0 and outcome.errors == str(tmp_path / "out.errors.jsonl")
    bodies = [Completion.model_validate(x["response"]["body"]) for x in read_jsonl(out)]
    assert [b.model for b in bodies] == ["base"] * 6 and bodies[0].object == "text_completion"
    assert [len(b.choices) for b in bodies] == [1, 2] * 3  # each request's own n
    with pytest.raises(UserError, match=r"other settings \(model.max_model_len"):
        run_batch(
            str(source),
            str(out),
            model=str(models["plain"]),
            served_names=["base", "alias"],
            overrides=["run.engine=fake", "model.max_model_len=512"],
        )
    with pytest.raises(UserError, match="not the file this batch started from"):
        source.write_text(source.read_text() + json.dumps({**lines[0], "custom_id": "new"}) + "\n")
        run_batch(
            str(source),
            str(out),
            model=str(models["plain"]),
            served_names=["base", "alias"],
            overrides=["run.engine=fake"],
        )
    with pytest.raises(SpecError, match="sampling.max_tokens cannot be set"):
        run_batch(
            str(source), str(out), model=str(models["plain"]), overrides=["sampling.max_tokens=3"]
        )
    nothing = tmp_path / "bad.jsonl"
    nothing.write_text('{"custom_id": "z", "params": {"stream": true, "messages": []}}\n')
    empty = run_batch(str(nothing), str(tmp_path / "z.jsonl"), model=str(models["plain"]))
    assert (empty.total, empty.completed, empty.failed, empty.report) == (1, 0, 1, None)
    [errored] = read_jsonl(tmp_path / "z.jsonl")  # no job at all: just the error line
    assert MessageBatchIndividualResponse.model_validate(errored).result.type == "errored"
    missing = batch_cli(str(tmp_path / "none.jsonl"), str(out), "--model", str(models["plain"]))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr
    no_model = batch_cli(str(source), str(out), "--model", str(tmp_path / "no-model"))
    assert (
        no_model.returncode == 2
        and "--model" in no_model.stderr
        and "Traceback" not in no_model.stderr
    )


def test_a_batch_from_s3_to_s3(models, tmp_path, s3_env):
    client = s3_env.client()
    prefix = f"batches/{uuid.uuid4().hex[:8]}"
    source = tmp_path / "requests.jsonl"
    good, bad = openai_file(source, good=6)
    client.put_object(Bucket=s3_env.bucket, Key=f"{prefix}/in.jsonl", Body=source.read_bytes())
    base = f"s3://{s3_env.bucket}/{prefix}"
    done = batch_cli(
        f"{base}/in.jsonl",
        f"{base}/out.jsonl",
        "--model",
        str(models["chat"]),
        *FAKE,
        env=s3_env.env(),
    )
    assert done.returncode == 0, done.stderr
    for name in ("out.jsonl", "out.errors.jsonl"):
        body = client.get_object(Bucket=s3_env.bucket, Key=f"{prefix}/{name}")["Body"].read()
        (tmp_path / name).write_bytes(body)
    assert_each_once(tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl", good, bad)
    marker = client.get_object(
        Bucket=s3_env.bucket, Key=f"{prefix}/out.jsonl.nightshift/batch.json"
    )
    assert json.loads(marker["Body"].read())["records"] == len(good) + 1  # too-long: a plan reject


@pytest.mark.engine
def test_a_real_engine_batch_killed_after_its_first_checkpoint(models, tmp_path):
    """The holdout's mix (a shared system text, JSON-schema requests, braces and Jinja in
    the text, bad lines) through vLLM. The CLI is SIGKILLed alone after the first
    checkpoint, as the OOM killer does: its engine processes die with it (none is left
    holding the accelerator), and the rerun answers every line exactly once."""
    source, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    good, bad = openai_file(source, good=16)
    args = [
        str(source),
        str(out),
        "--model",
        str(models["chat"]),
        "--set",
        "run.chunk_records=4",
        "--set",
        "engine.extra.enforce_eager=true",
        "--set",
        "engine.max_num_seqs=16",
    ]
    cli = start_until_checkpoint(["batch", "run", *args], f"{out}.nightshift/job")
    assert cli.children(recursive=True), "the engine runs in a child process"
    assert kill_alone(cli) == [], "engine processes outlived the CLI"
    assert not out.exists()
    second = batch_cli(*args, timeout=600)
    assert second.returncode == 0, second.stderr
    failed = assert_each_once(out, tmp_path / "results.errors.jsonl", good, bad)
    assert {f["custom_id"] for f in failed} >= {"too-long", "bad-model", "bad-stream"}
    for line in read_jsonl(out):
        if int(line["custom_id"].split("-")[1]) % 4 == 0:  # guided: valid JSON of the schema
            content = line["response"]["body"]["choices"][0]["message"]["content"]
            if line["response"]["body"]["choices"][0]["finish_reason"] == "stop":
                assert json.loads(content)["label"] in {"billing", "bug", "other"}


def test_a_batch_never_replaces_a_file_it_did_not_write(models, tmp_path):
    """OUTPUT or ERRORS naming INPUT (or each other), or a file already there when the
    batch starts, is refused before anything runs; an empty or non-batch INPUT is named."""
    source = tmp_path / "in.jsonl"
    openai_file(source, good=2)
    before = source.read_bytes()
    model = str(models["chat"])
    fake = ["run.engine=fake"]
    with pytest.raises(UserError, match="OUTPUT: .* is INPUT"):
        run_batch(str(source), str(source), model=model, overrides=fake)
    with pytest.raises(UserError, match="--errors: .* is INPUT"):
        run_batch(str(source), str(tmp_path / "o.jsonl"), model=model, errors_url=str(source))
    with pytest.raises(UserError, match="--errors: .* is OUTPUT"):
        out = str(tmp_path / "o.jsonl")
        run_batch(str(source), out, model=model, errors_url=out, overrides=fake)
    taken = tmp_path / "taken.jsonl"
    taken.write_text("the user's own file\n")
    with pytest.raises(UserError, match="already exists"):
        run_batch(str(source), str(taken), model=model, overrides=fake)
    (tmp_path / "t2.errors.jsonl").write_text("mine\n")
    with pytest.raises(UserError, match="--errors: .* already exists"):  # the default one
        run_batch(str(source), str(tmp_path / "t2.jsonl"), model=model, overrides=fake)
    assert source.read_bytes() == before and taken.read_text() == "the user's own file\n"
    assert not (tmp_path / "taken.jsonl.nightshift").exists()  # nothing converted
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    (tmp_path / "notes.txt").write_text("just some notes\n[1, 2]\n")
    for name, problem in [("empty.jsonl", "holds no request"), ("notes.txt", "no line is")]:
        done = batch_cli(str(tmp_path / name), str(tmp_path / f"{name}.out"), "--model", model)
        assert done.returncode == 2 and problem in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    empty = batch_cli(
        str(tmp_path / "empty.jsonl"),
        str(tmp_path / "e.out"),
        "--model",
        model,
        "--format",
        "openai",
    )
    assert empty.returncode == 2 and "holds no request" in empty.stderr


def test_the_weights_dtype_can_be_set_like_the_engine(models, tmp_path):
    """``--set model.dtype`` (fp32 on CPUs without bf16 units, fp16 on older GPUs)
    reaches the batch's job spec; sampling keys stay refused."""
    import yaml

    source = tmp_path / "in.jsonl"
    openai_file(source, good=3)
    out = tmp_path / "out.jsonl"
    overrides = ["run.engine=fake", "model.dtype=float32"]
    outcome = run_batch(str(source), str(out), model=str(models["chat"]), overrides=overrides)
    assert outcome.completed == 3
    job = yaml.safe_load((Path(outcome.work) / "job.yaml").read_text())
    assert job["model"]["dtype"] == "float32"


def test_a_linked_model_folder_is_served_under_the_name_given(models, tmp_path):
    """``--model ./model`` serves ``model`` even when ./model links to a folder named
    otherwise (README's first batch file does this with the demo's SmolLM2)."""
    link = tmp_path / "model"
    link.symlink_to(models["chat"], target_is_directory=True)
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    unnamed = chat_line("b", "hi")
    del unnamed["body"]["model"]
    lines = [chat_line("a", "hello", model="model"), unnamed]
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    outcome = run_batch(str(source), str(out), model=str(link), overrides=["run.engine=fake"])
    assert (outcome.completed, outcome.failed) == (2, 0)
    assert [x["response"]["body"]["model"] for x in read_jsonl(out)] == ["model", "model"]


def test_served_names_come_from_the_path_as_typed(tmp_path, monkeypatch):
    from nightshift.batch.records import served_names

    monkeypatch.chdir(tmp_path)
    assert served_names("./models/qwen/") == ["qwen"]
    assert served_names(".") == [tmp_path.name]  # no name typed: the folder's own
    assert served_names("./x", ["gpt-4o-mini", "gpt-4o-mini", "b"]) == ["gpt-4o-mini", "b"]


def test_the_summary_says_time_cost_and_report_and_a_log_gets_progress_lines(models, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(chat_line("a", "Hello")) + '\n{"custom_id": "b" "body": {}}\n')
    out = tmp_path / "out.jsonl"
    done = subprocess.run(  # no -q, and stderr a pipe: a log, not a terminal
        [*NIGHTSHIFT, "batch", "run", str(source), str(out), "--model", str(models["chat"]),
         *FAKE, "--set", "cost.usd_per_gpu_hour=2"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith("time: ") and "cost: $" in summary and "per 1M tokens" in summary
    report = Path(summary.rpartition("report: ")[2])
    assert report.name == "report.json" and report.is_file()
    assert "generate: 1/1 records (100.0%)" in done.stderr  # a progress line, not a bar
    error = json.loads((tmp_path / "out.errors.jsonl").read_text())["response"]["body"]["error"]
    assert error["message"] == (
        "line 2: not valid JSON: expecting ',' delimiter at column 19, at '\"body\": {}}'"
    )


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"custom_id": "a", "body": {}\n', "the line ends before its JSON does"),
        (b'{"a": 1 "b": 2}\n', "expecting ',' delimiter at column 9, at '\"b\": 2}'"),
        (b"\xff{}", "not UTF-8 text: byte 0xff at byte 1"),
    ],
)
def test_a_bad_json_line_is_told_in_plain_words(raw, said):
    from nightshift.batch.records import BadRequest, load_line

    with pytest.raises(BadRequest, match="^not ") as caught:
        load_line(raw)
    assert said in str(caught.value) and "char " not in str(caught.value)
