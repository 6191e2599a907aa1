"""``batch serve`` batches that end before their job does, as the official clients see
them: a cancel and an expired window keep every answered request (checkpoints of the
shard the job stopped in included) and counts never fall; a failed Anthropic batch has
a result line per request; live counts of several-input embeddings lines count lines;
settings every batch would fail on stop the server before it listens (fake engine,
slowed down, one shard: a batch under ``plan.shard_records`` commits nothing early)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import openai

from .batchserver import (
    FAKE,
    KEY,
    Server,
    anthropic_request,
    chat_line,
    jsonl,
    output_lines,
    wait_for,
)

SLOW = {"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.05"}
SLOWER = {"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.08"}
CHUNKS = ["--set", "run.chunk_records=4"]  # checkpoints, one shard (no plan.shard_records)


def polled(get, done, seen: list, timeout: float = 180):
    """``get()`` until ``done``, every value kept in ``seen``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = get()
        seen.append(value)
        if done(value):
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out; last: {seen[-1] if seen else None}")


def grew(counts: list[tuple[int, int]]) -> bool:
    pairs = zip(counts, counts[1:], strict=False)
    return all(a <= b for before, after in pairs for a, b in zip(before, after, strict=True))


def test_expired_and_cancelled_batches_keep_every_answer_and_counts_never_fall(serve):
    # the window leaves a loaded machine's job start-up (up to 25 s seen) time to answer
    server = serve(*FAKE, *CHUNKS, "--expire-after", "40", env=SLOWER)
    client = server.openai()
    lines = [chat_line(f"r{i}", f"Count to {i}", max_tokens=3) for i in range(1000)]
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    seen: list = []
    ended = polled(
        lambda: client.batches.retrieve(batch.id),
        lambda b: b.status in ("completed", "failed", "expired", "cancelled"),
        seen,
    )
    assert ended.status == "expired"
    live = max(b.request_counts.completed for b in seen if b.status == "in_progress")
    counts = ended.request_counts
    assert 0 < live <= counts.completed < 1000, (live, counts)
    assert counts.completed + counts.failed == 1000
    answered = output_lines(client, ended.output_file_id)
    expired = output_lines(client, ended.error_file_id)
    assert len(answered) == counts.completed and all(x["response"]["body"] for x in answered)
    assert Counter(x["error"]["code"] for x in expired) == {"batch_expired": counts.failed}
    ids = sorted(x["custom_id"] for x in answered + expired)
    assert ids == sorted(f"r{i}" for i in range(1000))

    claude = server.anthropic()
    slow = claude.messages.batches.create(
        requests=[anthropic_request(f"a{i}", f"count {i}", max_tokens=3) for i in range(150)]
    )
    before = wait_for(
        lambda: claude.messages.batches.retrieve(slow.id),
        lambda b: b.request_counts.succeeded >= 12,
    )
    claude.messages.batches.cancel(slow.id)
    over = wait_for(
        lambda: claude.messages.batches.retrieve(slow.id),
        lambda b: b.processing_status == "ended",
    )
    c = over.request_counts
    assert before.request_counts.succeeded <= c.succeeded < 150
    assert c.succeeded + c.canceled == 150 and c.errored == 0
    kinds = Counter(r.result.type for r in claude.messages.batches.results(slow.id))
    assert kinds == {"succeeded": c.succeeded, "canceled": c.canceled}


def test_live_counts_of_several_input_embeddings_lines_count_lines(serve):
    server = serve(*FAKE, *CHUNKS, env=SLOWER)  # a line done every 3 s: seen part-way
    client = server.openai()
    # each line's texts longer than the next line's: run longest first, the lines end one
    # after another, not all at once at the end (which live counts could not tell apart)
    lines = [
        {"custom_id": f"e{j}", "method": "POST", "url": "/v1/embeddings",
         "body": {"input": [f"line {j}:" + " word" * 4 * (4 - j) + f" {i}" for i in range(40)]}}
        for j in range(4)
    ] + ["not json"]  # fmt: skip
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    seen: list = []
    done = polled(
        lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed", seen
    )
    counts = [(b.request_counts.completed, b.request_counts.failed) for b in seen]
    assert all(c + f <= 5 for c, f in counts), counts
    assert grew(counts), counts
    assert any(0 < c < 4 for c, _ in counts), counts  # seen part-way: lines, not texts
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 1)
    said = f"batch {batch.id} (openai): "  # the server's log: a line per step
    log = wait_for(server.log.read_text, lambda text: f"{said}ended completed" in text)
    assert f"{said}received; 0 completed, 0 failed of 5" in log and f"{said}started" in log
    assert f"{said}ended completed; 4 completed, 1 failed of 5 requests" in log


def test_a_failed_anthropic_batch_answers_every_request_errored(serve, tmp_path, models):
    link = tmp_path / "demo"
    link.symlink_to(models["chat"])
    server = serve(*FAKE, model=link)
    claude = server.anthropic()
    link.unlink()  # the model folder gone: every batch from now on fails
    batch = claude.messages.batches.create(
        requests=[anthropic_request(f"a{i}", f"hello {i}") for i in range(3)]
    )
    ended = wait_for(
        lambda: claude.messages.batches.retrieve(batch.id),
        lambda b: b.processing_status == "ended",
    )
    assert ended.request_counts.errored == 3
    results = list(claude.messages.batches.results(batch.id))
    assert sorted(r.custom_id for r in results) == ["a0", "a1", "a2"]
    for r in results:
        assert r.result.type == "errored"
        assert "--model" in r.result.error.error.message  # why: the folder is gone


def test_serve_refuses_settings_every_batch_would_fail_on_before_listening(tmp_path, models, serve):
    model = str(models["chat"])
    cases = {
        "--model": ["--model", str(tmp_path / "no-model")],
        "sampling.max_tokens": ["--model", model, "--set", "sampling.max_tokens=3"],
        "engine.max_num_seqs": ["--model", model, "--set", "engine.max_num_seqs=abc"],
        "--adapter support": ["--model", model, "--adapter", f"support={tmp_path}/none"],
    }
    for named, args in cases.items():
        done = subprocess.run(
            [sys.executable, "-m", "nightshift.cli", "batch", "serve", *args,
             "--store", str(tmp_path / "store"), "--port", "1", "--api-key", KEY],
            capture_output=True, text=True, timeout=60, env={**os.environ},
        )  # fmt: skip
        assert done.returncode == 2, (named, done.stderr)
        assert done.stderr.count("\n") == 1 and named in done.stderr, done.stderr
    running = serve(*FAKE)
    port = running.url.rsplit(":", 1)[1]
    second = Server(tmp_path / "store", models["chat"], *FAKE)
    done = subprocess.run(second.command(int(port)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"--port {port}" in done.stderr, done.stderr
    assert openai.OpenAI(base_url=f"{running.url}/v1", api_key=KEY).models.list().data
