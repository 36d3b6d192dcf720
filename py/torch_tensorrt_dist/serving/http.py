"""uvicorn's set-up for rank 0's HTTP process (``http_process.py``), on a socket bound before the
model loads.

    sock = bind_socket("127.0.0.1", 0)      # before loading: a busy port fails first
    config = uvicorn_config(app, event_loop())   # guarded connections (``connections.py``)

uvicorn runs its h11 protocol with a connection cap and a
header deadline (``connections.py``), whether or not httptools is installed, on uvloop's event
loop where uvloop is installed (the ``serve`` extra's; :func:`event_loop`).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving.connections import (
    ConnectionLimits,
    connection_cap,
    guarded_protocol,
    quiet_logs,
)

__all__ = ["bind_socket", "event_loop", "uvicorn_config"]

logger = logging.getLogger(__name__)

#: seconds an idle kept-alive connection stays open (uvicorn's default)
KEEP_ALIVE_S = 5


def event_loop() -> str:
    """The HTTP server's event loop: ``"uvloop"`` where uvloop is installed (the ``serve``
    extra), else ``"asyncio"`` (the server's ready line names it).

    Why uvloop: each streamed chunk's event-loop work runs in C with it. Measured when HTTP
    still shared rank 0's process (two servers up at once, rounds alternated, 4 pairs,
    2026-12-05): uvloop over asyncio 1.12x output tok/s at 8 clients (1.08-1.17), 1.11x at one
    (1.04-1.18)."""
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
    """uvicorn's configuration of our server (rank 0's HTTP process): the
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
