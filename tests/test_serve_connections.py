"""Connection hygiene on a real uvicorn (the server's configuration, in a thread of this
process, with a short header deadline and a small cap): slow and idle clients are cut off,
connections beyond the cap get a 503 at once, a request uvicorn cannot parse gets OpenAI's 400,
and the server answers normally afterwards."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from torch_tensorrt_dist.serving.connections import ConnectionLimits
from torch_tensorrt_dist.serving.http import bind_socket

from ._http_thread import HttpThread

CAP = 8
HEADER_S = 0.5


@pytest.fixture(scope="module")
def http() -> Iterator[HttpThread]:
    app = FastAPI()

    @app.get("/health")
    async def health() -> Any:
        return JSONResponse({"status": "ready"})

    server = HttpThread(app, bind_socket("127.0.0.1", 0), ConnectionLimits(CAP, HEADER_S))
    server.start()
    yield server
    server.stop()


def _connect(http: HttpThread) -> socket.socket:
    s = socket.create_connection((http.host, http.port), timeout=10)
    return s


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    return data


def _get(http: HttpThread) -> bytes:
    with _connect(http) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return _read_all(s)


def _error(raw: bytes, status: int) -> dict[str, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), raw[:200]
    error: dict[str, Any] = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_slow_head_gets_408_and_an_idle_connection_is_closed(http: HttpThread) -> None:
    start = time.monotonic()  # before the connection: its deadline starts when it is accepted
    with _connect(http) as slow, _connect(http) as idle:
        slow.sendall(b"GET /health HTTP/1.1\r\nHo")  # then nothing
        error = _error(_read_all(slow), 408)
        assert f"did not arrive within {HEADER_S:g} s" in error["message"]
        assert _read_all(idle) == b""  # closed without a word: it never began a request
        assert HEADER_S <= time.monotonic() - start < HEADER_S + 5
    assert b'"ready"' in _get(http)


def test_a_kept_alive_connection_gets_a_new_deadline_per_request(http: HttpThread) -> None:
    with _connect(http) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status":"ready"}'):
            first += s.recv(4096)
        assert first.startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /hea")  # the next request's head, never finished
        assert _error(_read_all(s), 408)


def test_connections_beyond_the_cap_get_503_at_once(http: HttpThread) -> None:
    held = [_connect(http) for _ in range(CAP)]
    time.sleep(0.2)
    try:
        with _connect(http) as extra:
            error = _error(_read_all(extra), 503)
            assert f"holds {CAP} connections" in error["message"]
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert b'"ready"' in _get(http)


def test_a_request_that_is_not_http_gets_openai_400(http: HttpThread) -> None:
    for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", b"\x00\xff" * 8):
        with _connect(http) as s:
            s.sendall(junk + b"\r\n\r\n")
            assert "not valid HTTP/1.1" in _error(_read_all(s), 400)["message"]
    assert b'"ready"' in _get(http)


def test_connections_send_without_nagles_delay(http: HttpThread) -> None:
    # A response goes out in two writes (head, body); with Nagle's algorithm on, the second
    # waits for the client's delayed ACK: about 40 ms on every request of a kept-alive
    # connection (a socket made with protocol 0 did not get asyncio's TCP_NODELAY)
    with _connect(http) as s:
        for _ in range(2):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b'"ready"' not in data and (chunk := s.recv(4096)):
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 ")
        sockets = [
            c.transport.get_extra_info("socket") for c in http.server.server_state.connections
        ]
        assert sockets and all(
            sk.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for sk in sockets
        )


def test_http_thread_runs_uvloop_where_installed(http: HttpThread) -> None:
    """The serve extra brings uvloop; the HTTP thread's loop is uvloop's then (the figures in
    docs/performance.md), asyncio's where it is not installed."""
    try:
        import uvloop
    except ImportError:
        assert http.loop == "asyncio"
        return
    assert http.loop == "uvloop"
    loop = http.server.servers[0].get_loop() if http.server.servers else None
    assert isinstance(loop, uvloop.Loop)


def test_event_loop_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop's where it is installed, else asyncio's."""
    import sys

    from torch_tensorrt_dist.serving.http import event_loop

    try:
        import uvloop  # noqa: F401
    except ImportError:
        assert event_loop() == "asyncio"
    else:
        assert event_loop() == "uvloop"
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    assert event_loop() == "asyncio"
