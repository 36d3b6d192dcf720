"""Connection hygiene for uvicorn's HTTP/1.1 protocol: a cap, a header deadline, quiet logs.

    protocol = guarded_protocol(ConnectionLimits(max_connections=connection_cap(), ...))
    uvicorn.Config(app, http=protocol, ...)
    quiet_logs()                  # one line per cause per minute from uvicorn and asyncio

uvicorn (h11) holds a connection until its client closes it, and accepts as many as the
process has file descriptors: a client that sends a byte every few seconds holds its
connection for ever, and enough idle connections leave rank 0 unable to open a file or accept
``/health``. Here:

- a connection beyond ``max_connections`` (below the open-file limit) gets a 503 at once and
  is closed (uvicorn's ``limit_concurrency`` answers only once a request has arrived, which an
  idle connection never sends, and still holds its descriptor);
- a request's line and headers must arrive within ``header_timeout_s`` of the connection (or
  of the previous response): else a 408 (some bytes came) or a silent close (none came). The
  body has its own deadline (``request_body.py``); an idle keep-alive connection is closed
  after uvicorn's ``timeout_keep_alive``;
- uvicorn's own 400 for a request h11 cannot parse has OpenAI's body;
- :func:`quiet_logs` lets one record per cause (logger, message, exception type) through per
  interval, the first with its traceback, and counts the others: a flood of bad connections
  cannot flood the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ConnectionLimits",
    "OncePerCause",
    "connection_cap",
    "guarded_protocol",
    "quiet_logs",
    "raw_response",
]

logger = logging.getLogger(__name__)

#: Descriptors left to the rest of rank 0 (checkpoint files, gloo sockets, pipes).
RESERVED_FDS = 128
DEFAULT_MAX_CONNECTIONS = 1024
_REASONS = {400: "Bad Request", 408: "Request Timeout", 503: "Service Unavailable"}


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections rank 0 holds at once, and how long a request's head may take."""

    max_connections: int
    header_timeout_s: float = 10.0


def connection_cap(
    soft_fd_limit: int | None = None, *, wanted: int = DEFAULT_MAX_CONNECTIONS
) -> int:
    """``wanted`` connections, or fewer where the open-file limit (``RLIMIT_NOFILE``'s soft
    value) leaves less than that after :data:`RESERVED_FDS`."""
    if soft_fd_limit is None:
        soft_fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft_fd_limit == resource.RLIM_INFINITY:
            soft_fd_limit = 1 << 20
    return max(1, min(wanted, soft_fd_limit - RESERVED_FDS))


def raw_response(status: int, message: str, *, retry_after: str | None = None) -> bytes:
    """A whole HTTP/1.1 response with OpenAI's error body that closes the connection (written
    to the socket directly, outside any request)."""
    from torch_tensorrt_dist.serving.protocol import error_body

    body = json.dumps(error_body(status, message)).encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS.get(status, '')}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the cap and the header deadline of ``limits``."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _partial = False  # bytes of a request's head arrived, not the whole head

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                logger.warning(
                    "refused a connection: %d are open (the cap is %d)",
                    len(self.connections) - 1,
                    limits.max_connections,
                )
                self._close_with(
                    503,
                    f"the server holds {limits.max_connections} connections already; retry later",
                    retry_after="1",
                )
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:
                self._partial = self._partial or bool(data)
            elif self._deadline is not None:  # the head has arrived: the body has its own
                self._deadline.cancel()
                self._deadline = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's head, on this kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self._close_with(400, f"the request is not valid HTTP/1.1 ({msg})")

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._partial = False
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._expired)

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self._partial:
                self._close_with(
                    408,
                    f"the request's line and headers did not arrive within "
                    f"{limits.header_timeout_s:g} s",
                )
            else:
                self.transport.close()

        def _close_with(self, status: int, message: str, *, retry_after: str | None = None) -> None:
            if not self.transport.is_closing():
                self.transport.write(raw_response(status, message, retry_after=retry_after))
                self.transport.close()

    return GuardedH11Protocol


class OncePerCause(logging.Filter):
    """Lets one record per cause (logger, message template, exception type) through per
    ``interval_s``; the next one that passes says how many were held back."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.interval_s, self.clock = interval_s, clock
        self._seen: dict[tuple[str, str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, str(record.msg), exc)
        now = self.clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.interval_s:
                self._seen[key] = (last[0], last[1] + 1)
                return False
            held = last[1] if last is not None else 0
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like this in the last {self.interval_s:g} s)"
        return True


_quiet = OncePerCause()
#: Loggers a hostile client can make write: uvicorn's, asyncio's (accept errors) and ours.
QUIET_LOGGERS = (
    "uvicorn.error",
    "asyncio",
    "torch_tensorrt_dist.serving.api",
    "torch_tensorrt_dist.serving.responses",
    __name__,
)


def quiet_logs(names: tuple[str, ...] = QUIET_LOGGERS, filt: Any = None) -> None:
    """Install :class:`OncePerCause` on ``names`` (once per process)."""
    filt = filt or _quiet
    for name in names:
        log = logging.getLogger(name)
        if filt not in log.filters:
            log.addFilter(filt)
