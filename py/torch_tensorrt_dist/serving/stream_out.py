"""A request's pieces on their way to its client: coalesced while the client reads slowly, cut
when it stops (the HTTP event loop; no tensors).

    queue = PieceQueue(max_pending=1 << 22)    # a Sink's queue: step loop -> handler
    response = PacedStream(chunks, queue, limits, on_cut=cut)   # server-sent events

Each request has its own queue, filled by the step loop once per step and emptied by its
handler as fast as its client reads. A piece that arrives while the previous piece of the same
sequence still waits is merged into it (its text appended, token counts and logprobs joined,
the earliest step time kept): a slow client gets fewer, larger events and the queue holds at
most one piece per sequence, never one per token. Its size (characters of text, plus
``LOGPROBS_COST`` per token with logprobs) is bounded by ``max_pending``; past it, or when one
write to the client does not complete within ``write_timeout_s`` (a client that stopped
reading: its socket and the server's write buffer are full; the response's start, its status
line and headers, too), the stream ends: the request is
cancelled on the ranks (``on_cut``), then an error event and ``data: [DONE]`` are written for
the client to find when it reads again (if that cannot complete within ``CLOSE_AFTER`` write
timeouts, the connection is closed). Other streams never wait on it: each is its own task, and
nothing of it is queued on rank 0.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from torch_tensorrt_dist.config.jobs import DEFAULT_WRITE_TIMEOUT_S
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving import protocol
from torch_tensorrt_dist.serving.bridge import MAX_PENDING, PieceQueue

__all__ = ["CUT_CODE", "CUT_STATUS", "DEFAULT_WRITE_TIMEOUT_S", "PacedStream", "StreamLimits"]

#: the status (its error type) and code an error event of a cut stream carries
CUT_STATUS = 408
CUT_CODE = "slow_client"
#: write timeouts a cut stream's error event waits for its client before the connection closes
CLOSE_AFTER = 10


@dataclass(frozen=True)
class StreamLimits:
    """How a server treats a client that reads slowly."""

    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    """Seconds one write may wait for the client to read; then its stream is cut."""
    max_pending: int = MAX_PENDING
    """The size a stream's coalesced pending pieces may reach; then its stream is cut."""

    def __post_init__(self) -> None:
        if not self.write_timeout_s > 0:
            raise ConfigError(f"--write-timeout must be > 0 seconds, got {self.write_timeout_s:g}")
        if self.max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1, got {self.max_pending}")


class PacedStream(StreamingResponse):
    """Server-sent events written with a deadline: ``chunks`` (``Answer.events`` and the
    closing ``[DONE]``) are written one by one; a write that does not complete within the
    write timeout, or a queue past its bound, cuts the stream (``on_cut``, then an error
    event and ``[DONE]``; a start that does not complete in time writes nothing more).
    ``on_write(made)`` is told each event written after its text's earliest step
    (``Piece.made``); ``on_close()`` once the stream ends, however it ends (its request's
    cleanup: an async generator never started runs nothing of its own on ``aclose``)."""

    def __init__(
        self,
        chunks: AsyncIterator[tuple[str, float]],
        queue: PieceQueue,
        limits: StreamLimits,
        *,
        on_cut: Callable[[str], None],
        on_write: Callable[[float], None] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        # StreamingResponse's own writer is not used: ``stream_response`` reads ``chunks``
        super().__init__(cast(Any, chunks), media_type="text/event-stream")
        self._chunks, self._queue, self._limits = chunks, queue, limits
        self._on_cut, self._on_write, self._on_close = on_cut, on_write, on_close

    async def stream_response(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        reason, started = None, False
        try:
            reason = await self._send(send, start)  # the status line too: under the deadline
            started = reason is None
            if started:
                async for chunk, made in self._chunks:
                    reason = await self._write(send, chunk)
                    if reason is not None:
                        break
                    if made and self._on_write is not None:
                        self._on_write(made)
        finally:
            if reason is not None:
                self._on_cut(reason)  # before the handler's cleanup: the request is cancelled
            with anyio.CancelScope(shield=True):  # also when the client went away
                await cast(Any, self._chunks).aclose()
            if self._on_close is not None:  # also when ``chunks`` never started
                self._on_close()
        if not started:
            return  # nothing was written: uvicorn closes the connection
        if reason is not None:
            error = protocol.error_body(CUT_STATUS, reason, code=CUT_CODE)
            for chunk in (f"data: {json.dumps(error)}\n\n", "data: [DONE]\n\n"):
                if await self._write(send, chunk, last=True) is not None:
                    return  # it still does not read: uvicorn closes the connection
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _write(self, send: Send, chunk: str, *, last: bool = False) -> str | None:
        """Write ``chunk``; None once written, else why the stream is cut. The ``last`` events
        of a cut stream wait ``CLOSE_AFTER`` write timeouts for the client, the queue unbounded
        (its request is cancelled: nothing more comes)."""
        message = {"type": "http.response.body", "body": chunk.encode(), "more_body": True}
        return await self._send(send, message, last=last)

    async def _send(self, send: Send, message: dict[str, Any], *, last: bool = False) -> str | None:
        """Send ``message`` (the response's start or a body chunk) under the write deadline:
        None once sent, else why the stream is cut. A timer, or the queue passing its bound,
        cancels the waiting send (nothing of it is sent: uvicorn waits for the client before
        it writes, and writes without waiting)."""
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None  # an ASGI app runs in a task
        cut: list[str] = []

        def expire(why: str) -> None:
            if not cut:
                cut.append(why)
                task.cancel()

        timeout = self._limits.write_timeout_s * (CLOSE_AFTER if last else 1)
        if not last and self._queue.over:
            cut.append("full")
            return self._why(cut[0], timeout)
        timer = loop.call_later(timeout, expire, "timeout")
        if not last:
            self._queue.on_full = partial(expire, "full")
        try:
            await send(message)
        except asyncio.CancelledError:
            if not cut:
                raise  # this stream was cancelled: the client went away
            uncancel = getattr(task, "uncancel", None)  # Python >= 3.11 counts cancels
            if uncancel is not None:
                uncancel()
        finally:
            timer.cancel()
            self._queue.on_full = None
        return self._why(cut[0], timeout) if cut else None

    def _why(self, cut: str, timeout: float) -> str:
        if cut == "full":
            return (
                f"the client read too slowly: {self._queue.size} characters of this stream "
                f"were waiting (at most {self._queue.max_pending}); the stream was cut"
            )
        return (
            f"the client did not read for {timeout:g} s (the server's write timeout is "
            f"{self._limits.write_timeout_s:g} s); the stream was cut"
        )
