"""The batch server as tests start it: a real ``nightshift batch serve`` process on a
free loopback port, and what the official clients need to drive it."""

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
from openai.types import Batch, FileObject

KEY = "sk-nightshift-test-key"
FAKE = ["--set", "run.engine=fake"]


def free_port() -> int:
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
        port = free_port()
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
        lambda b: b.status in ("completed", "failed", "cancelled", "expired"),
    )


def output_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x]


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
