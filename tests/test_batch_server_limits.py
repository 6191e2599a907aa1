"""``nightshift batch serve`` against hostile clients: JSON bodies whose parse would cost
far more than their bytes, deletes of files a batch needs, and a forged Host header.

Each test starts the real server (``batchserver``) with the fake engine and drives it
with the official clients and with raw ``httpx`` posts.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from .batchserver import (
    FAKE,
    KEY,
    Server,
    anthropic_request,
    chat_line,
    finished,
    free_port,
    jsonl,
    openai_batch,
    wait_for,
)

ANTHROPIC_HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def anthropic_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text[:300]
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    return body["error"]["message"]


def ended(client: anthropic.Anthropic, batch_id: str):
    return wait_for(
        lambda: client.messages.batches.retrieve(batch_id),
        lambda b: b.processing_status == "ended",
    )


def test_hostile_json_bodies_get_400_in_the_providers_shape_and_cost_little(serve):
    server = serve(*FAKE)
    ant, oai = server.anthropic(), server.openai()
    http = httpx.Client(base_url=server.url, timeout=120)

    deep = anthropic_request("deep", "hi", metadata={"user_id": "u"}, stop_sequences=nested(200))
    with pytest.raises(anthropic.BadRequestError, match="deeper than"):
        ant.messages.batches.create(requests=[deep])
    deeper = b'{"requests": [{"custom_id": "a", "params": {"x": ' + b"[" * 5000
    deeper += b"]" * 5000 + b"}}]}"
    message = anthropic_error(
        http.post("/v1/messages/batches", content=deeper, headers=ANTHROPIC_HEADERS), 400
    )
    assert "Traceback" not in message

    before = peak_rss_mb(server.proc.pid)
    lists = b",".join([b"[]"] * 3_500_000)  # 10.5 MB that json.loads makes ~300 MB of
    bloated = b'{"requests": [{"custom_id": "a", "params": {"messages": [' + lists + b"]}}]}"
    anthropic_error(
        http.post("/v1/messages/batches", content=bloated, headers=ANTHROPIC_HEADERS), 400
    )
    assert peak_rss_mb(server.proc.pid) - before < 120

    for bad in (b"[1, 2]", b"\xff\xfe{", b'{"requests": [' + b"1" * 5000 + b"]}", b"{"):
        anthropic_error(
            http.post("/v1/messages/batches", content=bad, headers=ANTHROPIC_HEADERS), 400
        )

    uploaded = oai.files.create(file=("in.jsonl", jsonl([chat_line("a", "hi")])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="deeper than") as refused:
        oai.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"metadata": {"k": "v"}, "x": nested(200)},
        )
    assert refused.value.response.json()["error"]["type"] == "invalid_request_error"
    auth = {"Authorization": f"Bearer {KEY}"}
    too_big = http.post("/v1/batches", content=b'{"x": "' + b"a" * (2 << 20) + b'"}', headers=auth)
    assert too_big.status_code == 413 and too_big.json()["error"]["message"]
    opened = http.post("/v1/batches", content=b"[" * 100_000, headers=auth)
    assert opened.status_code == 400 and opened.json()["error"]["message"]

    # the server serves on: a good batch of each kind still runs
    good = ant.messages.batches.create(requests=[anthropic_request("ok", "Hello")])
    assert ended(ant, good.id).request_counts.succeeded == 1
    batch = oai.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert finished(oai, batch.id).status == "completed"


def test_a_file_a_batch_needs_is_kept_and_results_are_checked_before_streaming(serve):
    server = serve(*FAKE, env={"NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.05"})
    oai, ant = server.openai(), server.anthropic()
    lines = [chat_line(f"a-{i}", "hi") for i in range(40)] + ["{broken"]
    batch = openai_batch(oai, lines)
    with pytest.raises(openai.ConflictError, match=batch.id):
        oai.files.delete(batch.input_file_id)  # it runs from it
    batch = finished(oai, batch.id)
    assert batch.output_file_id and batch.error_file_id
    for file_id in (batch.output_file_id, batch.error_file_id):
        with pytest.raises(openai.ConflictError, match=batch.id) as refused:
            oai.files.delete(file_id)
        assert refused.value.response.json()["error"]["type"] == "invalid_request_error"
        assert oai.files.retrieve(file_id).id == file_id
    assert oai.files.delete(batch.input_file_id).deleted  # ended: its input may go
    spare = oai.files.create(file=("spare.jsonl", jsonl([chat_line("b", "x")])), purpose="batch")
    assert oai.files.delete(spare.id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(spare.id)

    msg = ended(ant, ant.messages.batches.create(requests=[anthropic_request("a", "hi")]).id)
    results = [f for f in oai.files.list(purpose="batch_output") if msg.id in f.filename]
    assert results
    for result in results:
        with pytest.raises(openai.ConflictError):
            oai.files.delete(result.id)
    assert [r.custom_id for r in ant.messages.batches.results(msg.id)] == ["a"]

    # results whose file is gone from the store: an error before any header of a 200
    for result in results:
        (server.store / "files" / f"{result.id}.jsonl").unlink()
    gone = httpx.get(
        f"{server.url}/v1/messages/batches/{msg.id}/results", headers={"x-api-key": KEY}
    )
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"


def test_results_url_comes_from_the_servers_address_never_the_host_header(serve, tmp_path):
    server = serve(*FAKE)
    ant = server.anthropic()
    msg = ended(ant, ant.messages.batches.create(requests=[anthropic_request("a", "hi")]).id)
    forged = {"x-api-key": KEY, "Host": "evil.example:9999", "X-Forwarded-Proto": "https"}
    got = httpx.get(f"{server.url}/v1/messages/batches/{msg.id}", headers=forged).json()
    assert got["results_url"] == f"{server.url}/v1/messages/batches/{msg.id}/results"
    listed = httpx.get(f"{server.url}/v1/messages/batches", headers=forged).json()
    assert listed["data"][0]["results_url"] == got["results_url"]
    assert [r.custom_id for r in ant.messages.batches.results(msg.id)] == ["a"]
    server.stop()

    proxied = serve(*FAKE, "--public-url", "https://batches.example.com/nightshift/")
    got = httpx.get(f"{proxied.url}/v1/messages/batches/{msg.id}", headers=forged).json()
    assert got["results_url"] == (
        f"https://batches.example.com/nightshift/v1/messages/batches/{msg.id}/results"
    )

    refused = subprocess.run(
        [*Server(tmp_path / "s2", "m").command(free_port()), "--public-url", "ftp://x?y"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert refused.returncode == 2 and "the URL clients reach" in refused.stderr


def test_the_shape_check_counts_structure_not_the_strings_contents():
    from nightshift.batch.http import MAX_JSON_DEPTH, ApiError, parse_json

    text = '[[[{"a": "\\\\"}]]] \\" ' * 10_000  # brackets, quotes and escapes in a string
    body = {"requests": [{"custom_id": "a", "params": {"text": text, "list": nested(50)}}]}
    assert parse_json(json.dumps(body).encode()) == body
    with pytest.raises(ApiError, match="deeper"):
        parse_json(json.dumps({"x": nested(MAX_JSON_DEPTH)}).encode())
    with pytest.raises(ApiError, match="not valid JSON"):
        parse_json(b'{"a": "unterminated [[[[')
    with pytest.raises(ApiError, match="UTF-8"):  # whose bytes could fake a quote
        parse_json(json.dumps({"a": "\u0122"}).encode("utf-16-le"))
    started = time.monotonic()  # an unterminated string of escaped quotes: no rescans
    with pytest.raises(ApiError, match="not valid JSON"):
        parse_json(b'{"a": "' + b'\\"' * 500_000)
    assert time.monotonic() - started < 5
