"""``nightshift batch serve`` driven by the official ``openai`` and ``anthropic`` clients.

Each test starts the real server (``python -m nightshift.cli batch serve``) on a free
loopback port, with the fake engine (``--set run.engine=fake``) except the one
real-engine test, which also SIGKILLs the server mid-batch and restarts it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types import Batch, FileObject
from openai.types.chat import ChatCompletion

KEY = "sk-nightshift-test-key"
FAKE = ["--set", "run.engine=fake"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One ``batch serve`` subprocess; ``start`` again (same store) after a kill."""

    def __init__(self, store: Path, model: Path | str, *args: str, env: dict | None = None):
        self.store, self.model, self.args, self.env = store, model, list(args), env or {}
        self.proc: subprocess.Popen | None = None
        self.log = store.parent / f"server-{uuid.uuid4().hex[:6]}.log"

    def command(self, port: int) -> list[str]:
        return [
            sys.executable,
            *("-m", "nightshift.cli", "batch", "serve"),
            *("--model", str(self.model), "--store", str(self.store), "--port", str(port)),
            *("--api-key", KEY, "--served-model-name", "demo", *self.args),
        ]

    def start(self, timeout: float = 60) -> str:
        port = _free_port()
        # A SIGKILLed server's GPU slot stays leased for a minute: each start its own limit.
        limit = {"NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(port),
                env={**os.environ, **limit, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                headers = {"Authorization": f"Bearer {KEY}"}
                if httpx.get(f"{self.url}/v1/models", headers=headers).status_code == 200:
                    return self.url
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError(f"the server did not start:\n{self.log.read_text()}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.kill()

    def openai(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)

    def anthropic(self, key: str = KEY) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=key, max_retries=0)


@pytest.fixture
def serve(tmp_path, models):
    started: list[Server] = []

    def start(*args: str, model: Path | None = None, env: dict | None = None) -> Server:
        server = Server(tmp_path / "store", model or models["chat"], *args, env=env)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def chat_line(custom_id: str, text: str, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "demo", "messages": [{"role": "user", "content": text}], **body},
    }


def jsonl(lines: list) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def wait_for(get, done, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = get()
        if done(value):
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out; last: {value}")


def openai_batch(client: openai.OpenAI, lines: list) -> Batch:
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert isinstance(uploaded, FileObject) and uploaded.purpose == "batch"
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def finished(client: openai.OpenAI, batch_id: str) -> Batch:
    return wait_for(
        lambda: client.batches.retrieve(batch_id),
        lambda b: b.status in ("completed", "failed", "cancelled"),
    )


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x]


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


def anthropic_request(custom_id: str, text: str, **params) -> dict:
    return {
        "custom_id": custom_id,
        "params": {
            "model": "demo",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": text}],
            **params,
        },
    }


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
        [*Server(tmp_path / "s2", "m").command(_free_port())[:-4], "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "NIGHTSHIFT_API_KEY"},
    )
    assert refused.returncode == 2 and "API key" in refused.stderr


@pytest.mark.engine
def test_a_real_engine_server_killed_mid_batch_answers_every_request_once(models, tmp_path):
    """One server, real vLLM: an OpenAI batch and an Anthropic batch queued behind it;
    the server SIGKILLs itself at its first checkpoint and is started again on the
    same store, which finishes both (the second on the first's warm engine)."""
    args = [
        *("--set", "run.chunk_records=4", "--set", "engine.max_num_seqs=8"),
        *("--set", "engine.extra.enforce_eager=true"),
    ]
    crash = {"NIGHTSHIFT_CRASH_AT": "chunk.written:1"}
    server = Server(tmp_path / "store", models["chat"], *args, env=crash)
    server.start()
    try:
        lines = [
            chat_line(f"o-{i}", f"Ticket {i}: my invoice is wrong", max_tokens=6) for i in range(12)
        ]
        lines += ["not json", chat_line("o-0", "a repeat"), chat_line("o-x", "hi", stream=True)]
        batch = openai_batch(server.openai(), lines)
        requests = [anthropic_request(f"a-{i}", f"Summarise ticket {i}") for i in range(6)]
        mbatch = server.anthropic().messages.batches.create(requests=requests)
        assert server.proc.wait(600) == -signal.SIGKILL, server.log.read_text()[-3000:]
        server.env = {}
        server.start(timeout=120)
        client = server.openai()
        done = finished(client, batch.id)
        assert done.status == "completed", done
        out = output_lines(client, done.output_file_id)
        errors = output_lines(client, done.error_file_id)
        for line in out:
            ChatCompletion.model_validate(line["response"]["body"])
        ids = sorted(x["custom_id"] for x in out + errors if x["custom_id"] is not None)
        assert ids == sorted([f"o-{i}" for i in range(12)] + ["o-0", "o-x"])
        assert len(out) == 12 and len(errors) == 3
        assert done.request_counts.completed == 12 and done.usage.output_tokens > 0

        claude = server.anthropic()
        ended = wait_for(
            lambda: claude.messages.batches.retrieve(mbatch.id),
            lambda b: b.processing_status == "ended",
            timeout=600,
        )
        assert ended.request_counts.succeeded == 6
        results = list(claude.messages.batches.results(mbatch.id))
        assert sorted(r.custom_id for r in results) == sorted(f"a-{i}" for i in range(6))
        assert all(r.result.type == "succeeded" for r in results)
    finally:
        server.stop()


def test_warm_engines_lend_one_engine_to_runs_of_the_same_settings(models, tmp_path):
    """What keeps the server's engine up between batches: the same engine settings get
    the same engine back; a discarded (crashed) or stopped one is closed, never lent."""
    from nightshift.jobs.spec import JobSpec
    from nightshift.running import engines

    from .conftest import spec_dict

    def spec(**engine) -> JobSpec:
        data = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out")
        data["run"] = {"engine": "fake"}
        data["engine"] = {**data["engine"], **engine}
        return JobSpec.model_validate(data)

    with engines.warm_engines():
        first = engines.build_engine(spec())
        inner = first._engine
        first.close()
        again = engines.build_engine(spec())
        assert again._engine is inner  # handed back, lent again
        again.discard()
        again.close()
        assert engines.build_engine(spec())._engine is not inner  # a discarded one is gone
        other = engines.build_engine(spec(max_num_seqs=8))
        assert other._engine is not inner
    assert engines.build_engine(spec()).__class__.__name__ == "FakeEngine"  # off outside


def _flow_run(input_file_id: str):
    """The Prefect flow run of the batch over ``input_file_id`` (its job is named after
    the input file), from the test session's Prefect server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        [run] = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"batch-{input_file_id}-"))
        )
    return run


def test_batches_that_cannot_run_fail_validating_and_queued_cancels_end_at_once(serve):
    """OpenAI fails a batch whose input cannot run while validating, with ``errors``;
    a cancel ends a batch still in the queue at once; each batch is a Prefect flow run,
    one at a time; files list and delete; the key never reaches the log; a bug in a
    handler is a 500 in OpenAI's shape, without a traceback."""
    server = serve(*FAKE, env={"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.05"})
    client = server.openai()

    def create(content: bytes, endpoint: str = "/v1/chat/completions") -> Batch:
        uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
        return client.batches.create(
            input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h"
        )

    with pytest.raises(openai.BadRequestError, match="metadata"):
        client.batches.create(
            input_file_id=client.files.create(file=("m.jsonl", b"{}\n"), purpose="batch").id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"n": 1},  # type: ignore[dict-item]
        )
    empty = create(b"\n")
    not_jsonl = create(b"hello\nworld\n")
    wrong_endpoint = create(jsonl([chat_line("c", "hi")]), endpoint="/v1/completions")
    slow = create(jsonl([chat_line(f"s-{i}", f"count to {i}") for i in range(300)]))
    queued = create(jsonl([chat_line("q", "never runs")]))
    last = create(jsonl([chat_line(f"l-{i}", f"hello {i}", max_tokens=4) for i in range(3)]))
    for batch, code in (
        (empty, "empty_file"),
        (not_jsonl, "invalid_json_line"),
        (wrong_endpoint, "mismatched_endpoint"),
    ):
        failed = finished(client, batch.id)
        assert failed.status == "failed" and failed.failed_at and not failed.in_progress_at
        assert failed.errors and failed.errors.data[0].code == code, failed.errors
        assert failed.output_file_id is None and failed.error_file_id is None
    wait_for(lambda: client.batches.retrieve(slow.id), lambda b: b.status == "in_progress")
    assert client.batches.cancel(queued.id).status == "cancelled"  # not once slow ends
    assert client.batches.retrieve(queued.id).cancelled_at
    client.batches.cancel(slow.id)
    assert finished(client, slow.id).status == "cancelled"
    assert finished(client, last.id).status == "completed"
    first, second = _flow_run(slow.input_file_id), _flow_run(last.input_file_id)
    assert first.state.is_final() and second.state.is_completed()
    assert first.end_time <= second.start_time  # one batch at a time

    listed = client.files.list(purpose="batch")
    assert last.input_file_id in [f.id for f in listed] and listed.data[0].id == listed.first_id
    assert client.files.delete(empty.input_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(empty.input_file_id)
    assert client.models.retrieve("demo").id == "demo"
    (server.store / "files" / f"{last.input_file_id}.jsonl").unlink()  # a broken store
    broken = httpx.get(
        f"{server.url}/v1/files/{last.input_file_id}/content",
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert broken.status_code == 500 and broken.json()["error"]["type"] == "server_error"
    assert "Traceback" not in broken.text
    with pytest.raises(openai.AuthenticationError):
        server.openai("sk-wrong").batches.list()
    assert KEY not in server.log.read_text() and "sk-wrong" not in server.log.read_text()


def test_a_server_killed_while_finalizing_finishes_each_batch_once_in_order(serve):
    """SIGKILLed after a batch's job ended, as it writes the results, with another batch
    queued: the next start finalizes the first again (same files) and runs the second."""
    server = serve(*FAKE, env={"NIGHTSHIFT_CRASH_AT": "batch.finalizing"})
    client = server.openai()
    first = openai_batch(client, [chat_line(f"a-{i}", f"hi {i}", max_tokens=4) for i in range(8)])
    second = openai_batch(client, [chat_line(f"b-{i}", f"yo {i}", max_tokens=4) for i in range(4)])
    assert server.proc.wait(120) == -signal.SIGKILL
    server.env = {}
    server.start()
    client = server.openai()
    done = [finished(client, b.id) for b in (first, second)]
    assert [b.status for b in done] == ["completed", "completed"]
    assert done[0].completed_at <= done[1].in_progress_at  # first in, first out
    for batch, prefix, n in ((done[0], "a", 8), (done[1], "b", 4)):
        ids = [x["custom_id"] for x in output_lines(client, batch.output_file_id)]
        assert sorted(ids) == sorted(f"{prefix}-{i}" for i in range(n))
        assert batch.request_counts.completed == n and batch.error_file_id is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "gpu-box.example.com"])
def test_a_host_beyond_loopback_needs_a_key(host):
    from nightshift.batch.server import check_exposure
    from nightshift.errors import UserError

    with pytest.raises(UserError, match="API key"):
        check_exposure(host, None)
    check_exposure(host, "sk-some-key")
    for loopback in ("127.0.0.1", "::1", "localhost"):
        check_exposure(loopback, None)
