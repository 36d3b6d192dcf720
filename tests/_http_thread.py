"""uvicorn in a thread of the test process, with the server's configuration
(``http.uvicorn_config``): the connection tests' server, without ranks or a forked process."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving.connections import ConnectionLimits, connection_cap
from torch_tensorrt_dist.serving.http import event_loop, uvicorn_config


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
        self.sock.close()
        assert not self.thread.is_alive(), f"the HTTP thread did not stop within {timeout_s} s"
