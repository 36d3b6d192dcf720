"""uvicorn in a thread of rank 0, on a socket bound before the model loads.

    sock = bind_socket("127.0.0.1", 0)      # before loading: a busy port fails first
    http = HttpThread(app, sock)            # guarded connections (``connections.py``)
    http.start()                            # serves from its own asyncio loop
    http.url                                # http://127.0.0.1:PORT (the real port)
    http.stop()

The step loop keeps the main thread (and its signal handlers); uvicorn installs no signal
handler outside the main thread. uvicorn runs its h11 protocol with a connection cap and a
header deadline (``connections.py``), whether or not httptools is installed, on uvloop's event
loop where uvloop is installed (the ``serve`` extra's; :func:`event_loop`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving.connections import (
    ConnectionLimits,
    connection_cap,
    guarded_protocol,
    quiet_logs,
)

__all__ = ["HttpThread", "bind_socket", "event_loop", "uvicorn_config"]

logger = logging.getLogger(__name__)

#: seconds an idle kept-alive connection stays open (uvicorn's default)
KEEP_ALIVE_S = 5


def event_loop() -> str:
    """The HTTP server's event loop: ``"uvloop"`` where uvloop is installed (the ``serve``
    extra), else ``"asyncio"`` (the server's ready line names it).

    Why uvloop: the HTTP thread shares rank 0's GIL with the step loop, and each streamed
    chunk's Python (the event loop's share of it in C with uvloop) is time the step may wait
    for it. Two servers of the same code up at once, rounds alternated (4 pairs, 2026-12-05):
    uvloop over asyncio 1.12x output tok/s at 8 clients (1.08-1.17), 1.11x at one
    (1.04-1.18) (docs/performance.md)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port); ConfigError naming the port.

    Its connections send without Nagle's delay (``TCP_NODELAY``). asyncio sets that on each
    accepted socket only when the socket says its protocol is TCP, and a socket made with the
    default protocol (0) does not: each response written in two parts (head, then body) then
    waited for the client's delayed ACK, about 40 ms on Linux, on every request of a kept-alive
    connection. So the protocol is named, and the option set on the listening socket as well
    (accepted sockets inherit it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another "
            "--port (0 picks a free one)"
        ) from exc
    return sock


def uvicorn_config(app: Any, loop: str, limits: ConnectionLimits | None = None) -> Any:
    """uvicorn's configuration of our server (a thread of rank 0, or its HTTP process): the
    guarded h11 protocol, event loop ``loop``, no lifespan, no access log."""
    import uvicorn

    quiet_logs()
    return uvicorn.Config(
        app,
        http=guarded_protocol(limits or ConnectionLimits(max_connections=connection_cap())),
        loop=loop,
        log_level="warning",
        lifespan="off",
        access_log=False,
        timeout_graceful_shutdown=2,
        timeout_keep_alive=KEEP_ALIVE_S,
    )


class HttpThread:
    """An ASGI app served by uvicorn from a daemon thread, on ``sock`` (bound already)."""

    def __init__(self, app: Any, sock: socket.socket, limits: ConnectionLimits | None = None):
        import uvicorn

        self.sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self.limits = limits or ConnectionLimits(max_connections=connection_cap())
        self.loop = event_loop()
        self.server = uvicorn.Server(uvicorn_config(app, self.loop, self.limits))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="http", daemon=True
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"the HTTP server on {self.url} did not start")
            time.sleep(0.01)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            logger.warning("the HTTP thread did not stop within %.0f s", timeout_s)
        self.sock.close()
