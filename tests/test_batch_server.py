"""``nightshift batch serve`` driven by the official ``openai`` and ``anthropic`` clients.

Each test starts the real server (``python -m nightshift.cli batch serve``, see
``batchserver``) on a free loopback port, with the fake engine (``--set
run.engine=fake``); kills, restarts and the real engine are in ``test_batch_restarts``.
"""

from __future__ import annotations

import os
import subprocess

import anthropic
import httpx
import openai
import pytest
from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types.chat import ChatCompletion

from .batchserver import (
    FAKE,
    KEY,
    Server,
    anthropic_request,
    chat_line,
    finished,
    free_port,
    openai_batch,
    output_lines,
    wait_for,
)


def test_openai_client_upload_create_poll_download_list_cancel(serve):
    server = serve(*FAKE, env={"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.02"})
    client = server.openai()
    assert [m.id for m in client.models.list()] == ["demo"]
    lines = [chat_line(f"req-{i}", f"Say hello {i}", max_tokens=8) for i in range(6)]
    lines += ["{broken json", chat_line("req-0", "a repeat of req-0")]
    batch = openai_batch(client, lines)
    assert batch.status in ("validating", "in_progress") and batch.request_counts.total == 8
    done = finished(client, batch.id)
    assert done.status == "completed", done
    assert done.completed_at and done.in_progress_at and done.finalizing_at
    assert done.request_counts.completed == 6 and done.request_counts.failed == 2
    assert done.usage is not None and done.usage.input_tokens > 0
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    out = output_lines(client, done.output_file_id)
    errors = output_lines(client, done.error_file_id)
    for line in out:
        ChatCompletion.model_validate(line["response"]["body"])
        assert line["response"]["status_code"] == 200 and line["error"] is None
    assert sorted(x["custom_id"] for x in out) == [f"req-{i}" for i in range(6)]
    assert len(errors) == 2

    # cancel: a slower batch stops gracefully and keeps what was answered
    slow = openai_batch(client, [chat_line(f"s-{i}", f"count to {i}") for i in range(400)])
    wait_for(lambda: client.batches.retrieve(slow.id), lambda b: b.status == "in_progress")
    cancelling = client.batches.cancel(slow.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    cancelled = finished(client, slow.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at
    partial = output_lines(client, cancelled.output_file_id)
    assert len(partial) < 400 and cancelled.request_counts.completed == len(partial)

    # lists: newest first, cursor pagination
    third = openai_batch(client, [chat_line("x", "one more")])
    finished(client, third.id)
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == [third.id, slow.id] and page.has_more
    assert [b.id for b in client.batches.list(limit=2, after=slow.id).data] == [batch.id]
    assert [b.id for b in client.batches.list(limit=1)] == [third.id, slow.id, batch.id]

    with pytest.raises(openai.AuthenticationError):
        server.openai("sk-wrong").batches.list()
    no_key = httpx.post(f"{server.url}/v1/files", files={"file": ("a.jsonl", b"{}\n")})
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"


def test_anthropic_client_create_retrieve_list_results_cancel(serve):
    server = serve(*FAKE, env={"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.02"})
    client = server.anthropic()
    requests = [anthropic_request(f"a-{i}", f"Hello {i}", system="Be brief.") for i in range(4)]
    requests.append(anthropic_request("a-bad", "x", model="another-model"))
    batch = client.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == 5
    done = wait_for(
        lambda: client.messages.batches.retrieve(batch.id),
        lambda b: b.processing_status == "ended",
    )
    assert done.ended_at and done.results_url
    assert done.request_counts.succeeded == 4 and done.request_counts.errored == 1
    results = list(client.messages.batches.results(batch.id))
    assert all(isinstance(r, MessageBatchIndividualResponse) for r in results)
    kinds = {r.custom_id: r.result.type for r in results}
    assert kinds == {**{f"a-{i}": "succeeded" for i in range(4)}, "a-bad": "errored"}
    assert results[0].result.message.content[0].type == "text"

    slow = client.messages.batches.create(
        requests=[anthropic_request(f"s-{i}", f"count {i}") for i in range(400)]
    )
    wait_for(lambda: client.messages.batches.retrieve(slow.id), lambda b: b.request_counts)
    canceling = client.messages.batches.cancel(slow.id)
    assert canceling.processing_status in ("canceling", "ended") and canceling.cancel_initiated_at
    ended = wait_for(
        lambda: client.messages.batches.retrieve(slow.id),
        lambda b: b.processing_status == "ended",
    )
    counts = ended.request_counts
    assert counts.canceled > 0 and counts.succeeded + counts.errored + counts.canceled == 400
    ids = [r.custom_id for r in client.messages.batches.results(slow.id)]
    assert sorted(ids) == sorted(f"s-{i}" for i in range(400))

    page = client.messages.batches.list(limit=1)
    assert [b.id for b in page.data] == [slow.id] and page.has_more
    assert [b.id for b in client.messages.batches.list(limit=1)] == [slow.id, batch.id]
    assert [b.id for b in client.messages.batches.list(after_id=slow.id).data] == [batch.id]

    with pytest.raises(anthropic.AuthenticationError):
        server.anthropic("sk-wrong").messages.batches.list()


def test_ids_limits_and_malformed_requests_get_4xx_json(serve, tmp_path):
    server = serve(*FAKE, "--max-upload-lines", "5", "--max-upload-mb", "1")
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"})
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    for path in (
        "/v1/files/..%2F..%2Fsecret",
        "/v1/files/file-..%2Fsecret/content",
        "/v1/files/file-0123/content",
        f"/v1/files/{'file-' + 'A' * 32}",
        "/v1/batches/batch_..%2F..%2Fsecret",
        "/v1/batches/batch_%2Fetc%2Fpasswd",
    ):
        response = http.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["type"] == "invalid_request_error"
    anth = http.get("/v1/messages/batches/msgbatch_..%2F..%2Fsecret", headers={"x-api-key": KEY})
    assert anth.status_code == 404 and anth.json()["type"] == "error"

    too_many = http.post(
        "/v1/files", files={"file": ("a.jsonl", b"{}\n" * 6)}, data={"purpose": "batch"}
    )
    assert too_many.status_code == 413 and too_many.json()["error"]["code"] == "file_too_large"
    too_big = http.post(
        "/v1/files", files={"file": ("a.jsonl", b"x" * (3 << 20))}, data={"purpose": "batch"}
    )
    assert too_big.status_code == 413 and "error" in too_big.json()

    broken = http.post("/v1/batches", content=b"{not json", headers={"content-type": "x"})
    assert broken.status_code == 400 and broken.json()["error"]["message"]
    for body in ([], {"input_file_id": "../x", "endpoint": "/v1/chat/completions"}):
        assert http.post("/v1/batches", json=body).status_code in (400, 404)
    assert http.get("/v1/batches", params={"limit": "many"}).status_code == 400
    assert http.post("/v1/files", data={"purpose": "batch"}).status_code == 400
    anth_bad = http.post(
        "/v1/messages/batches", json={"requests": "no"}, headers={"x-api-key": KEY}
    )
    assert anth_bad.status_code == 400
    assert anth_bad.json()["error"]["type"] == "invalid_request_error"
    assert http.get("/v1/batches", headers={"Authorization": "Bearer nope"}).status_code == 401

    refused = subprocess.run(
        [*Server(tmp_path / "s2", "m").command(free_port())[:-4], "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "NIGHTSHIFT_API_KEY"},
    )
    assert refused.returncode == 2 and "API key" in refused.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "gpu-box.example.com"])
def test_a_host_beyond_loopback_needs_a_key(host):
    from nightshift.batch.server import check_exposure
    from nightshift.errors import UserError

    with pytest.raises(UserError, match="API key"):
        check_exposure(host, None)
    check_exposure(host, "sk-some-key")
    for loopback in ("127.0.0.1", "::1", "localhost"):
        check_exposure(loopback, None)
