"""A loopback HTTP proxy in front of an S3 server that breaks requests on purpose.

Retries are only trustworthy once they have been seen to work: this proxy answers a
chosen share of requests with 503 SlowDown or 500, or drops the connection before the
request reaches the server, after the server did the work, or in the middle of the
response body. It is deterministic for a seed and counts what it injected.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from collections import Counter
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"

FAULT_KINDS = ("slowdown", "error500", "drop", "drop_after", "truncate")
_ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
)
_HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "expect", "upgrade"}


class FaultProxy:
    """A loopback HTTP/1.1 proxy that forwards to ``upstream`` and breaks some requests.

    Which requests fail: ``every=N`` fails requests N, 2N, ...; otherwise each request
    fails with probability ``rate``, from a generator seeded with ``seed``. ``kinds`` are
    drawn from the same generator: ``slowdown`` (503 SlowDown), ``error500`` (500
    InternalError), ``drop`` (connection closed before the request reaches the server),
    ``drop_after`` (the server did the work, the answer is lost), ``truncate`` (status
    and headers sent, the body cut in half). ``max_faults`` stops injecting after that
    many. Requests pass through byte for byte, Host header included, so SigV4 holds.
    """

    def __init__(
        self,
        upstream: str,
        rate: float = 0.0,
        *,
        every: int = 0,
        kinds: tuple[str, ...] = FAULT_KINDS,
        seed: int = 0,
        max_faults: int | None = None,
    ) -> None:
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        self.upstream = upstream.removeprefix("http://").rstrip("/")
        self.rate, self.every, self.kinds, self.max_faults = rate, every, kinds, max_faults
        self.requests = 0
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((HOST, 0), _ProxyHandler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self._server.server_address[1]}"

    @property
    def faults(self) -> int:
        return sum(self.injected.values())

    def next_fault(self) -> str | None:
        """Decide the fate of the next request (in arrival order, under a lock)."""
        with self._lock:
            self.requests += 1
            if self.max_faults is not None and self.faults >= self.max_faults:
                return None
            hit = self.requests % self.every == 0 if self.every else self._rng.random() < self.rate
            if not hit:
                return None
            kind = self._rng.choice(self.kinds)
            self.injected[kind] += 1
            return kind

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as boto3 uses it

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        self._relay()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _relay(self) -> None:
        proxy: FaultProxy = self.server.proxy  # type: ignore[attr-defined]
        fault = proxy.next_fault()
        if fault == "drop":
            return self._drop()
        body = self._read_body()
        if fault in ("slowdown", "error500"):
            return self._error(fault)
        status, reason, headers, data = self._forward(proxy.upstream, body)
        if fault == "drop_after" or (fault == "truncate" and not data):
            return self._drop()
        self.send_response_only(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if fault == "truncate":
            self.wfile.write(data[: len(data) // 2])
            return self._drop()
        self.wfile.write(data)

    def _read_body(self) -> bytes:
        """The request body exactly as sent: by Content-Length, or raw chunked framing."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        raw = bytearray()
        while True:
            line = self.rfile.readline()
            raw += line
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                break
            raw += self.rfile.read(size + 2)  # the chunk and its CRLF
        while True:  # trailers, then the empty line
            line = self.rfile.readline()
            raw += line
            if line in (b"\r\n", b"\n", b""):
                return bytes(raw)

    def _forward(self, upstream: str, body: bytes):
        conn = HTTPConnection(upstream, timeout=60)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_HEADERS:
                    conn.putheader(name, value)
            conn.endheaders(body or None)
            response = conn.getresponse()
            data = response.read()
            skip = _HOP_HEADERS | {"transfer-encoding"}
            if self.command != "HEAD":
                skip = skip | {"content-length"}
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in skip]
            return response.status, response.reason, headers, data
        finally:
            conn.close()

    def _error(self, fault: str) -> None:
        status, code, message = (
            (503, "SlowDown", "Please reduce your request rate.")
            if fault == "slowdown"
            else (500, "InternalError", "We encountered an internal error. Please try again.")
        )
        data = _ERROR_XML.format(code=code, message=message).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _drop(self) -> None:
        """Close the connection without (the rest of) a response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
