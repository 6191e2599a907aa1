"""The fault proxy itself: it must forward exactly, or the S3 retry tests prove nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .faultproxy import FaultProxy


class _Echo(BaseHTTPRequestHandler):
    """Answers every request with what it received, as JSON."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_PUT(self) -> None:
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while size := int(self.rfile.readline().strip(), 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = json.dumps({"headers": dict(self.headers), "body": body.decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _put(conn: HTTPConnection, body, **kwargs) -> tuple[int, bytes]:
    conn.request("PUT", "/b/k?x=1", body=body, headers={"X-Amz-Date": "20260101T000000Z"}, **kwargs)
    response = conn.getresponse()
    return response.status, response.read()


def test_requests_pass_through_unchanged(echo):
    with FaultProxy(echo) as proxy:
        conn = HTTPConnection(proxy.endpoint.removeprefix("http://"))
        status, data = _put(conn, iter([b"ab", b"cd"]), encode_chunked=True)
        seen = json.loads(data)
        assert (status, seen["body"]) == (200, "abcd")
        assert seen["headers"]["Transfer-Encoding"] == "chunked"
        assert seen["headers"]["Host"] == proxy.endpoint.removeprefix("http://")
        assert seen["headers"]["X-Amz-Date"] == "20260101T000000Z"
        status, data = _put(conn, b"plain")  # the same kept-alive connection
        assert (status, json.loads(data)["body"]) == (200, "plain")
    assert proxy.requests == 2 and proxy.faults == 0


def test_faults_follow_the_plan(echo):
    with FaultProxy(echo, every=2, kinds=("slowdown",)) as proxy:
        conn = HTTPConnection(proxy.endpoint.removeprefix("http://"))
        statuses = [_put(conn, b"x")[0] for _ in range(4)]
        assert statuses == [200, 503, 200, 503]
        assert b"<Code>SlowDown</Code>" in _put(conn, b"x")[1] + _put(conn, b"x")[1]
    assert proxy.injected == {"slowdown": 3}
    with FaultProxy(echo, every=1, kinds=("drop",), max_faults=1) as proxy:
        conn = HTTPConnection(proxy.endpoint.removeprefix("http://"))
        with pytest.raises(ConnectionError):
            _put(conn, b"x")
        conn.close()
        assert _put(conn, b"y")[0] == 200
