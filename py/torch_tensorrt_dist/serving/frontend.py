"""The pipe between rank 0 and its HTTP process (``http_process.py``): the messages, and each
end's stand-ins for the other's inbox, sinks and metrics.

    channel = Channel(conn, state)    # one end's writer thread: send() only queues
    inbox = ForwardingInbox(channel)  # rank 0: what the child submits; admissions told back
    ChildInbox(channel, max_waiting)  # the child: the HTTP app's inbox, metrics and sinks

One socket pair, pickled messages in length-prefixed frames (``frames.py``: each arrives whole,
whatever its size), each end's writes from one writer thread: child -> rank 0 submissions (their
sink a :class:`SinkRef`), cancels, answered requests, HTTP metric counts, ``/metrics`` scrapes;
rank 0 -> child each step's pieces in one message (``bridge.deliver`` groups sinks by ``loop``:
the :class:`Channel`), admissions (the child counts the wait queue: 429 at once), state
(``/health``), scraped metrics, stop. A reader that cannot decode what it reads fails the
server: ``/health`` answers 503 with the reason, open requests a 503, and the server exits 1
(never "ready" while requests hang).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

from torch_tensorrt_dist.serving.bridge import (
    Failed,
    Inbox,
    Piece,
    QueueFull,
    ServerState,
    Sink,
    Submission,
)
from torch_tensorrt_dist.serving.frames import FrameBuffer, write_frame
from torch_tensorrt_dist.serving.metrics import ClientMetrics
from torch_tensorrt_dist.serving.protocol import RequestError

__all__ = ["GONE", "Channel", "ChildInbox", "ForwardingInbox", "RemoteSink", "SinkRef", "one_line"]

logger = logging.getLogger(__name__)

#: seconds ``/metrics`` waits for rank 0's reader thread
SCRAPE_TIMEOUT_S = 10.0
#: what the child answers when rank 0 has gone
GONE = "the server failed: its step loop ended"


@dataclass(frozen=True)
class SinkRef:
    """A sink of the child, by number (what a submission carries through the pipe)."""

    sid: int


class Channel:
    """One end's writer (rank 0's or the child's); on rank 0 also the ``loop`` of every
    :class:`RemoteSink`, so that ``deliver`` sends a step's pieces in one message.

    :meth:`send` only queues (it never blocks; a signal handler may call it while the thread it
    interrupted is inside it); one writer thread writes whole frames, so no thread waits for a
    slow reader. ``("state",)`` is written as the state at the time of the write (the latest
    wins). :attr:`closed` once a write failed (the other end has gone)."""

    def __init__(self, conn: socket.socket, state: ServerState | None = None) -> None:
        self.conn, self.state = conn, state
        self.closed = False
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()  # pickled, ("state",), None
        self._writer = threading.Thread(target=self._write, name="http-pipe-writer", daemon=True)
        self._writer.start()

    def send(self, message: tuple[Any, ...]) -> None:
        # pickled here: the writer holds the GIL only around its write (the step loop lost its
        # gain over the HTTP thread when the writer pickled each step's pieces)
        self._queue.put(message if message == ("state",) else ForkingPickler.dumps(message))

    def call_soon_threadsafe(self, _fn: Callable[..., Any], batch: list[tuple[Any, Any]]) -> None:
        self.send(("pieces", [(sink.sid, item) for sink, item in batch]))

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (for at most ``timeout_s``), then stop the writer."""
        self._queue.put(None)
        self._writer.join(timeout_s)

    def _write(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, tuple):  # ("state",): the state now
                st = self.state
                if st is None:
                    continue
                item = ForkingPickler.dumps(("state", st.state, st.reason, list(st.pids)))
            if self.closed:
                continue
            try:
                write_frame(self.conn.fileno(), item)
            except (OSError, ValueError):  # the other end has gone: nobody is listening
                self.closed = True
                logger.debug("dropped a message: the other end of the pipe has gone")


class RemoteSink:
    """Rank 0's stand-in for a sink of the child."""

    def __init__(self, sid: int, channel: Channel) -> None:
        self.sid, self.loop = sid, channel

    def put(self, item: Piece | Failed) -> None:
        self.loop.send(("pieces", [(self.sid, item)]))


class ForwardingInbox(Inbox):
    """Rank 0's inbox: what the child submits; each admission is told to the child (which
    counts the wait queue). The bound itself is the child's."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(max_waiting=1 << 30)
        self.channel = channel

    def left(self, n: int = 1) -> None:
        super().left(n)
        if n:
            self.channel.send(("left", n))


class _Counter:
    """A child-side counter of rank 0's metrics (``requests`` by status, ``prompt_tokens``)."""

    def __init__(self, send: Callable[[tuple[Any, ...]], bool], name: str, label: str = ""):
        self.send, self.name, self.label = send, name, label

    def labels(self, label: str) -> _Counter:
        return _Counter(self.send, self.name, label)

    def inc(self, amount: float = 1) -> None:
        self.send(("count", self.name, self.label, amount))


class ChildInbox:
    """The child's inbox, metrics and sinks: what the HTTP app uses in place of rank 0's."""

    def __init__(self, channel: Channel, max_waiting: int) -> None:
        self.channel, self.max_waiting = channel, max_waiting
        self.waiting = 0
        self._sinks: dict[int, Sink] = {}
        self._sink_of: dict[int, int] = {}  # rid -> sid, until answered
        self._sids = itertools.count()
        self._scrapes: dict[int, asyncio.Future[bytes]] = {}
        self._scrape_ids = itertools.count()
        self.requests = _Counter(self._send, "requests")
        self.prompt_tokens = _Counter(self._send, "prompt_tokens")
        self.client = ClientMetrics()  # measured here; shown after rank 0's metrics
        self.write_delay = self.client.write_delay

    def _send(self, message: tuple[Any, ...]) -> bool:
        """Queue for rank 0; False where it has gone (its end of the pipe closed: the reader
        failed what was open)."""
        if self.channel.closed:
            return False
        self.channel.send(message)
        return True

    # the Inbox's side
    def submit(self, *subs: Submission) -> None:
        n = sum(sub.n for sub in subs)  # the queue counts sequences (prompts x n)
        if self.waiting + n > self.max_waiting:
            raise QueueFull(
                f"{self.waiting} sequences are waiting, this request adds {n} "
                f"(--max-queue {self.max_waiting})"
            )
        self.waiting += n
        sid = next(self._sids)
        self._sinks[sid] = subs[0].sink
        self._sink_of.update((sub.rid, sid) for sub in subs)
        ref = cast(Sink, SinkRef(sid))  # the sink stays here; the pipe carries its number
        if not self._send(("submit", [replace(sub, sink=ref) for sub in subs])):
            self.waiting -= n  # never queued: its places go back
            subs[0].sink.queue.put_nowait(Failed(503, GONE))

    def cancel(self, rid: int) -> None:
        self._send(("cancel", rid))

    def finished(self, rid: int) -> None:
        sid = self._sink_of.pop(rid, None)
        if sid is not None and sid not in self._sink_of.values():
            self._sinks.pop(sid, None)
        self._send(("finished", rid))

    # the Metrics' side
    async def scrape(self, waiting: int) -> bytes:
        """``/metrics``'s body, rendered by rank 0 (which holds every metric)."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        key = next(self._scrape_ids)
        self._scrapes[key] = future
        try:
            if not self._send(("scrape", key, waiting)):
                raise RequestError(503, GONE)
            return await asyncio.wait_for(future, timeout=SCRAPE_TIMEOUT_S) + self.client.render()
        except (TimeoutError, asyncio.TimeoutError):
            raise RequestError(
                503, f"rank 0 did not render the metrics within {SCRAPE_TIMEOUT_S:g} s"
            ) from None
        finally:
            self._scrapes.pop(key, None)

    # rank 0's messages, on the event loop
    def received(self, message: tuple[Any, ...], state: ServerState) -> bool:
        """Apply one message; False when it says stop."""
        kind = message[0]
        if kind == "pieces":
            for sid, item in message[1]:
                sink = self._sinks.get(sid)
                if sink is not None:
                    sink.queue.put_nowait(item)
        elif kind == "left":
            self.waiting -= message[1]
        elif kind == "state":
            state.state, state.reason, state.pids = message[1], message[2], message[3]
            self._send(("seen", state.state))  # rank 0 says "ready" once this has arrived
        elif kind == "scraped":
            future = self._scrapes.get(message[1])
            if future is not None and not future.done():
                future.set_result(message[2])
        elif kind == "stop":  # rank 0 has sent every answer it will: the rest get a 503
            self.fail_open(503, "the server is shutting down; retry elsewhere")
            return False
        return True

    def pump(self, fd: int, frames: FrameBuffer, state: ServerState) -> str:
        """Apply every message whole in the pipe now (``fd`` non-blocking): ``"open"``,
        ``"stop"`` (rank 0 said so), ``"gone"`` (rank 0 has ended: what is open gets a 503),
        or ``"failed"`` (a frame that does not decode: ``/health`` turns 503 with the reason,
        what is open gets a 503, rank 0 is told and ends the server)."""
        verdict = "open"
        try:
            for message in _messages(fd, frames):
                if not self.received(message, state):
                    verdict = "stop"
        except EOFError:
            self.channel.closed = True
            state.state, state.reason = "failed", "the step loop ended"
            self.fail_open(503, GONE)
            return "gone"
        except Exception as exc:
            logger.exception("the HTTP process cannot read rank 0's pipe")
            reason = f"the HTTP process cannot read rank 0's pipe: {one_line(exc)}"
            state.state, state.reason = "failed", reason
            self.fail_open(503, f"the server failed: {reason}")
            self.channel.send(("failed", reason))  # rank 0 exits 1 naming it
            return "failed"
        return verdict

    def fail_open(self, status: int, message: str) -> None:
        """Answer every open request (and waiting scrape) with ``status``: rank 0 has gone,
        or stopped without answering them, or the pipe failed."""
        for sink in self._sinks.values():
            sink.queue.put_nowait(Failed(status, message))
        self._sinks.clear()
        self._sink_of.clear()
        for future in self._scrapes.values():
            if not future.done():
                future.set_exception(RequestError(status, message))


def _messages(fd: int, frames: FrameBuffer) -> Iterator[tuple[Any, ...]]:
    """The messages whole in the pipe now (its fd non-blocking), from at most 16 MiB read (the
    event loop calls again while more is there); EOFError when it has closed."""
    for _ in range(16):
        try:
            data = os.read(fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            raise EOFError("the pipe failed") from None
        if not data:
            raise EOFError("rank 0 closed the pipe")
        for payload in frames.feed(data):
            yield ForkingPickler.loads(payload)


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
