"""uvicorn in a thread of rank 0, on a socket bound before the model loads.

    http = HttpThread(app, "127.0.0.1", 0)   # binds now: a busy port fails before any work
    http.start()                             # serves from its own asyncio loop
    http.url                                 # http://127.0.0.1:PORT (the real port)
    http.stop()

The step loop keeps the main thread (and its signal handlers); uvicorn installs no signal
handler outside the main thread.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["HttpThread"]

logger = logging.getLogger(__name__)


class HttpThread:
    """An ASGI app served by uvicorn from a daemon thread."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as exc:
            self.sock.close()
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror}); choose another "
                "--port (0 picks a free one)"
            ) from exc
        self.host, self.port = host, int(self.sock.getsockname()[1])
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
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
