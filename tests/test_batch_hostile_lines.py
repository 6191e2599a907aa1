"""Hostile request lines and odd destinations: one bad line is one error line, never a
failed batch, a stalled server queue or a traceback; a rerun replaces only files it
wrote; a destination that cannot be written is refused before anything runs."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nightshift.batch.lifecycle import finish, new_record
from nightshift.batch.openai import OpenAIParser
from nightshift.batch.queue import BatchQueue
from nightshift.batch.records import MAX_DEPTH, convert, load_line, numbered_lines
from nightshift.batch.state import count_lines
from nightshift.batch.store import BatchStore, new_id
from nightshift.cli import app
from nightshift.errors import StoreError

from .batchserver import FAKE, chat_line, finished, openai_batch, output_lines

runner = CliRunner()
SURROGATE = "\\ud800"  # as it stands in the JSON text: a lone high surrogate escape


@pytest.fixture(autouse=True)
def _own_gpu_limit(monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_GPU_LIMIT", f"test-gpu-{uuid.uuid4().hex[:8]}")


def batch_run(*args: str):
    return runner.invoke(app, ["batch", "run", *args, "--served-model-name", "demo", "-q"])


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def openai_text(*items: dict | str) -> str:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items)


def with_text(line: dict, raw: str) -> str:
    """``line`` as JSON text whose first message content is ``raw`` (JSON text)."""
    return json.dumps(line).replace('"@@"', raw)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def error_of(line: dict) -> dict:
    return line["response"]["body"]["error"]


def test_a_deeply_nested_line_is_one_invalid_json_line_and_the_batch_runs(models, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    nested = chat_line("deep", "hi")
    nested["body"]["metadata"] = "@@"
    too_deep = chat_line("deeper", "hi")
    too_deep["body"]["metadata"] = "@@"
    source.write_text(
        openai_text(
            chat_line("a", "first", max_tokens=4),
            with_text(nested, deep(5000)),
            with_text(too_deep, deep(MAX_DEPTH + 1)),
            chat_line("b", "second", max_tokens=4),
        )
    )
    done = batch_run(str(source), str(out), "--model", str(models["chat"]), *FAKE)
    assert done.exit_code == 0, done.output
    assert [x["custom_id"] for x in read_jsonl(out)] == ["a", "b"]
    errors = read_jsonl(tmp_path / "out.errors.jsonl")
    assert [error_of(x)["code"] for x in errors] == ["invalid_json", "invalid_json"]
    assert all("nested deeper than" in error_of(x)["message"] for x in errors)
    assert [error_of(x)["message"].split(":")[0] for x in errors] == ["line 2", "line 3"]


def test_a_deep_first_line_of_an_anthropic_file_is_one_errored_result(models, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good = {
        "custom_id": "m1",
        "params": {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    }
    source.write_text(openai_text('{"custom_id": "m0", "params": ' + deep(3000) + "}", good))
    done = batch_run(str(source), str(out), "--model", str(models["chat"]), *FAKE)
    assert done.exit_code == 0, done.output
    results = read_jsonl(out)
    assert [r["result"]["type"] for r in results] == ["errored", "succeeded"]


def test_a_lone_surrogate_is_one_error_line_and_the_others_are_answered(models, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    in_content = chat_line("bad-text", "@@")
    in_content["body"]["messages"][0]["content"] = "@@"
    in_key = chat_line("bad-key", "hi")
    in_key["body"]["metadata"] = {"KEY": "x"}
    source.write_text(
        openai_text(
            chat_line("a", "first", max_tokens=4),
            with_text(in_content, f'"abc{SURROGATE}def"'),
            json.dumps(in_key).replace('"KEY"', f'"k{SURROGATE}"'),
            json.dumps(chat_line("@@", "hi")).replace('"@@"', f'"id{SURROGATE}"'),
            with_text(chat_line("pair", "@@"), '"\\ud83d\\ude00 fine"'),
            chat_line("b", "second", max_tokens=4),
        )
    )
    done = batch_run(str(source), str(out), "--model", str(models["chat"]), *FAKE)
    assert done.exit_code == 0, done.output
    assert [x["custom_id"] for x in read_jsonl(out)] == ["a", "pair", "b"]
    errors = read_jsonl(tmp_path / "out.errors.jsonl")
    assert [x["custom_id"] for x in errors] == ["bad-text", "bad-key", None]
    assert all("surrogate" in error_of(x)["message"] for x in errors)
    assert error_of(errors[0])["param"] == "body.messages[0].content"


def test_a_lone_surrogate_in_an_anthropic_file_leaves_the_other_results(models, tmp_path):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    line = {
        "custom_id": "m",
        "params": {"max_tokens": 4, "messages": [{"role": "user", "content": "@@"}]},
    }
    source.write_text(
        openai_text(
            with_text({**line, "custom_id": "m0"}, f'"x{SURROGATE}"'),
            json.dumps({**line, "custom_id": "m1"}).replace('"@@"', '"fine"'),
        )
    )
    done = batch_run(str(source), str(out), "--model", str(models["chat"]), *FAKE)
    assert done.exit_code == 0, done.output
    results = read_jsonl(out)
    assert [(r["custom_id"], r["result"]["type"]) for r in results] == [
        ("m0", "errored"),
        ("m1", "succeeded"),
    ]
    assert "surrogate" in json.dumps(results[0]["result"])


def test_lines_split_on_newlines_only_for_counts_numbers_and_conversion(tmp_path):
    # A lone CR is JSON whitespace: this is one request on line 1, then one on line 2.
    first = json.dumps(chat_line("a", "x")).replace(', "method"', ',\r "method"')
    content = (first + "\n" + json.dumps(chat_line("b", "y")) + "\r\n{broken\n").encode()
    source = tmp_path / "in.jsonl"
    source.write_bytes(content)
    done = convert(source, OpenAIParser(), ["demo"], tmp_path / "r.parquet")
    assert count_lines(content) == done.lines == 3
    assert done.records == 2 and [b.line for b in done.bad] == [3]
    assert [n for n, _ in numbered_lines(io.BytesIO(content))] == [1, 2, 3]


def test_load_line_bounds_depth_before_parsing():
    assert load_line(b"[" + b"1," * 100 + b"1]") == [1] * 101
    assert load_line(('{"a": "' + "[" * 500 + '"}').encode()) == {"a": "[" * 500}
    for raw in (deep(MAX_DEPTH + 1), deep(100_000), '{"a":' * 2000):
        with pytest.raises(Exception, match="nested deeper than|not valid JSON") as caught:
            load_line(raw.encode())
        assert getattr(caught.value, "code", None) == "invalid_json"


# -- reruns and destinations --------------------------------------------------------


def small_batch(tmp_path: Path) -> Path:
    source = tmp_path / "in.jsonl"
    source.write_text(openai_text(chat_line("a", "x", max_tokens=4), "{broken"))
    return source


def test_a_rerun_never_replaces_a_file_it_did_not_write(models, tmp_path):
    source, out = small_batch(tmp_path), tmp_path / "out.jsonl"
    args = [str(source), str(out), "--model", str(models["chat"]), *FAKE]
    assert batch_run(*args).exit_code == 0
    precious = tmp_path / "precious.jsonl"
    precious.write_text("mine\n")
    refused = batch_run(*args, "--errors", str(precious))
    assert refused.exit_code == 2, refused.output
    assert "precious.jsonl already exists" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert precious.read_text() == "mine\n"
    other = tmp_path / "other.jsonl"
    other.write_text("theirs\n")
    work = str(tmp_path / "out.jsonl.nightshift")
    refused = batch_run(
        str(source), str(other), "--model", str(models["chat"]), *FAKE, "--work", work
    )
    assert refused.exit_code == 2 and "other.jsonl already exists" in refused.output
    assert other.read_text() == "theirs\n"
    # its own files may be replaced, and a new destination that does not exist is written
    again = batch_run(*args, "--errors", str(tmp_path / "new.errors.jsonl"))
    assert again.exit_code == 0, again.output
    assert (tmp_path / "new.errors.jsonl").is_file()
    assert batch_run(*args, "--errors", str(tmp_path / "new.errors.jsonl")).exit_code == 0
    assert batch_run(*args).exit_code == 0
    # a work folder from before destinations were recorded: its default OUTPUT is its own
    marker = Path(work, "batch.json")
    old = {k: v for k, v in json.loads(marker.read_text()).items() if k != "destinations"}
    marker.write_text(json.dumps(old))
    assert batch_run(*args).exit_code == 0
    assert str(out) in json.loads(marker.read_text())["destinations"]


@pytest.mark.parametrize(
    "where",
    ["out\\x.jsonl", "errors\\x", "folder", "folder/", "afile/out.jsonl"],
)
def test_an_odd_destination_is_one_line_exit_2_before_anything_runs(models, tmp_path, where):
    source = small_batch(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").write_text("a file\n")
    log = tmp_path / "fake.log"
    output, errors = str(tmp_path / "out.jsonl"), []
    if where.startswith("errors"):
        errors = ["--errors", f"{tmp_path}/{where}"]
    else:
        output = f"{tmp_path}/{where}"
    args = [str(source), output, "--model", str(models["chat"]), *FAKE, *errors]
    result = runner.invoke(
        app, ["batch", "run", *args, "-q"], env={"NIGHTSHIFT_FAKE_LOG": str(log)}
    )
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1
    assert not log.exists()
    assert not list(tmp_path.glob("**/batch.json"))  # nothing converted either


# -- the server's queue --------------------------------------------------------------


def queued(batches: BatchStore, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        record = new_record("openai", new_id("batch"), 1, input_file_id=new_id("file"))
        batches.put_batch(record)
        ids.append(record["id"])
    return ids


def run_queue(batches: BatchStore, validate, seconds: float = 3.0) -> dict[str, int]:
    ran: dict[str, int] = {}

    def run(record: dict) -> dict[str, int]:
        ran[record["id"]] = ran.get(record["id"], 0) + 1
        return {"total": 1, "completed": 1, "failed": 0} | {
            f"{k}_tokens": 0 for k in ("input", "output", "cached")
        }

    queue = BatchQueue(batches, run, lambda *a, **k: finish(batches, *a, **k), 0.01, validate)
    queue.start()
    time.sleep(seconds)
    queue.shutdown(10)
    return ran


def test_a_batch_whose_validation_breaks_fails_once_and_the_next_runs(tmp_path):
    batches = BatchStore(str(tmp_path / "store"))
    broken, good = queued(batches, 2)
    calls: list[str] = []

    def validate(record: dict) -> list:
        calls.append(record["id"])
        if record["id"] == broken:
            raise RecursionError("maximum recursion depth exceeded")
        return []

    ran = run_queue(batches, validate, 1.5)
    assert calls.count(broken) == 1 and ran == {good: 1}
    record = batches.batch(broken)
    assert record["status"] == "failed"
    assert "could not be validated" in record["errors"][0]["message"]
    assert batches.batch(good)["status"] == "completed"


def test_a_store_failure_is_retried_with_a_limit_and_never_blocks_the_next(tmp_path):
    batches = BatchStore(str(tmp_path / "store"))
    flaky, good = queued(batches, 2)
    calls: list[float] = []
    lock = threading.Lock()

    def validate(record: dict) -> list:
        if record["id"] == flaky:
            with lock:
                calls.append(time.monotonic())
            raise StoreError("cannot read files/x.jsonl: the bucket is down")
        return []

    ran = run_queue(batches, validate, 4.0)
    assert ran == {good: 1}
    assert batches.batch(good)["status"] == "completed"
    assert 2 <= len(calls) <= BatchQueue.STORE_ATTEMPTS
    gaps = [b - a for a, b in pairwise(calls)]
    assert gaps[-1] > gaps[0]  # backing off
    record = batches.batch(flaky)
    assert record["status"] == "failed", record
    assert "store" in record["errors"][0]["message"]


def test_a_deep_line_on_the_server_never_stalls_the_queue(serve):
    server = serve(*FAKE)
    client = server.openai()
    nested = chat_line("deep", "hi")
    nested["body"]["metadata"] = "@@"
    hostile = openai_batch(client, [with_text(nested, deep(5000)), chat_line("ok", "hi")])
    after = openai_batch(client, [chat_line("next", "hello")])
    first, second = finished(client, hostile.id), finished(client, after.id)
    assert first.status == "completed" and second.status == "completed", (first, second)
    assert [x["custom_id"] for x in output_lines(client, first.output_file_id)] == ["ok"]
    errors = output_lines(client, first.error_file_id)
    assert [error_of(x)["code"] for x in errors] == ["invalid_json"]
    assert [x["custom_id"] for x in output_lines(client, second.output_file_id)] == ["next"]
