"""``batch serve`` while a batch runs, as the official clients see it: request counts
that grow as records are answered, ``/v1/embeddings`` batches, and a completion window
that ends a batch ``expired`` with what finished kept (fake engine, slowed down)."""

from __future__ import annotations

import openai
from openai.types import CreateEmbeddingResponse
from openai.types.responses import Response

from .batchserver import (
    FAKE,
    anthropic_request,
    chat_line,
    finished,
    jsonl,
    output_lines,
    wait_for,
)

SLOW = {"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.03"}
CHECKPOINTS = ["--set", "run.chunk_records=8", "--set", "plan.shard_records=50"]


def embeddings_batch(client: openai.OpenAI, texts: list[str]):
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": t}}
        for i, t in enumerate(texts)
    ]
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )


def test_counts_grow_while_a_batch_runs_and_embeddings_batches_run(serve):
    server = serve(*FAKE, *CHECKPOINTS, env=SLOW)
    client = server.openai()
    lines = [chat_line(f"r{i}", f"Say {i}", max_tokens=4) for i in range(200)] + ["{broken"]
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    seen = wait_for(
        lambda: client.batches.retrieve(batch.id),
        lambda b: b.status == "in_progress" and b.request_counts.completed > 0,
    )
    assert seen.request_counts.completed < 200 and seen.request_counts.failed == 1
    done = finished(client, batch.id)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == (
        "completed", 200, 1,
    )  # fmt: skip

    texts = [f"passage {i}" for i in range(5)]
    embedded = finished(client, embeddings_batch(client, texts).id)
    assert embedded.status == "completed" and embedded.request_counts.completed == 5
    bodies = [
        CreateEmbeddingResponse.model_validate(x["response"]["body"])
        for x in output_lines(client, embedded.output_file_id)
    ]
    assert [len(b.data[0].embedding) for b in bodies] == [128] * 5  # the test model's size

    asks = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/responses",
         "body": {"model": "demo", "input": f"Question {i}", "max_output_tokens": 4}}
        for i in range(3)
    ]  # fmt: skip
    uploaded = client.files.create(file=("q.jsonl", jsonl(asks)), purpose="batch")
    asked = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
    )
    answered = finished(client, asked.id)
    assert answered.status == "completed" and answered.request_counts.completed == 3
    for x in output_lines(client, answered.output_file_id):
        assert Response.model_validate(x["response"]["body"]).output_text


def test_a_batch_past_its_window_expires_keeping_what_finished(serve):
    # the window leaves a loaded machine's job start-up (up to 25 s seen) time to answer
    server = serve(*FAKE, *CHECKPOINTS, "--expire-after", "30", env=SLOW)
    client = server.openai()
    lines = [chat_line(f"r{i}", f"Count to {i}", max_tokens=4) for i in range(1000)]
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.expires_at - batch.created_at == 30
    ended = finished(client, batch.id)
    assert ended.status == "expired" and ended.expired_at and ended.completed_at is None
    counts = ended.request_counts
    assert 0 < counts.completed < 1000 and counts.completed + counts.failed == 1000
    answered = output_lines(client, ended.output_file_id)
    expired = output_lines(client, ended.error_file_id)
    assert len(answered) == counts.completed and len(expired) == counts.failed
    assert {x["error"]["code"] for x in expired} == {"batch_expired"}
    assert all(x["response"] is None for x in expired)
    ids = sorted(x["custom_id"] for x in answered + expired)
    assert ids == sorted(f"r{i}" for i in range(1000))

    anthropic = server.anthropic()
    slow = anthropic.messages.batches.create(
        requests=[anthropic_request(f"a{i}", f"count {i}") for i in range(1000)]
    )
    over = wait_for(
        lambda: anthropic.messages.batches.retrieve(slow.id),
        lambda b: b.processing_status == "ended",
    )
    c = over.request_counts
    assert c.expired > 0 and c.succeeded + c.errored + c.expired == 1000
    kinds = [r.result.type for r in anthropic.messages.batches.results(slow.id)]
    assert kinds.count("expired") == c.expired and len(kinds) == 1000
