"""Rank 0's HTTP server in a process of its own (the default on Linux), beside the step loop.

    http = HttpProcess(build_app, sock, state, metrics, max_waiting=64)
    http.inbox                   # rank 0's inbox: what the child submits (the step loop's)
    http.start()                 # forks; /health answers (503 "warming") while graphs compile
    http.url, http.loop          # http://127.0.0.1:PORT, "uvloop"
    http.stop()                  # the child ends its connections and exits

Why: in one process the HTTP thread shared the interpreter lock (GIL) with the step loop,
which waited for it about 10 % of the time; split, output tokens/s over the HTTP thread's, 8
alternated pairs (2026-12-06): 1.07x at one client, 1.06x at eight (docs/performance.md).
vLLM's V1 splits the same way. There is no other mode: where ``os.fork`` is missing,
:meth:`HttpProcess.start` raises ConfigError.

The child is forked once the model is loaded, before the warm-up: it inherits the tokenizer,
chat template, grammar engine and request checks, and never runs a tensor operation. One socket
pair, pickled messages in length-prefixed frames (``frames.py``: each arrives whole, whatever
its size), each end's writes from one writer thread: child -> rank 0 submissions (their sink a
:class:`SinkRef`), cancels, answered requests, HTTP metric counts, ``/metrics`` scrapes; rank 0
-> child each step's pieces in one message (``bridge.deliver`` groups sinks by ``loop``: the
:class:`Channel`), admissions (the child counts the wait queue: 429 at once), state
(``/health``), scraped metrics, stop. When rank 0 is killed, the child's pipe closes: every open
request gets a 503, the child exits; when the child ends unasked, rank 0 exits 1 naming it. A
reader that cannot decode what it reads fails the server: ``/health`` answers 503 with the
reason, open requests a 503, and the server exits 1 (never "ready" while requests hang). The
child ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group): rank 0 drains, then
tells it to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving.bridge import (
    Failed,
    Inbox,
    Piece,
    QueueFull,
    ServerState,
    Sink,
    Submission,
)
from torch_tensorrt_dist.serving.frames import FrameBuffer, read_frame, write_frame
from torch_tensorrt_dist.serving.metrics import ClientMetrics
from torch_tensorrt_dist.serving.protocol import RequestError

__all__ = ["HttpProcess"]

logger = logging.getLogger(__name__)

#: seconds the child may take to end its connections once told to stop
STOP_TIMEOUT_S = 5.0
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
            reason = f"the HTTP process cannot read rank 0's pipe: {_one_line(exc)}"
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


class HttpProcess:
    """The HTTP app served by a forked child of rank 0 (see the module docstring)."""

    def __init__(
        self,
        build_app: Callable[[ChildInbox, ServerState], Any],
        sock: socket.socket,
        state: ServerState,
        metrics: Any,
        *,
        max_waiting: int,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        """``on_lost(reason)``: called (from a thread) when the child ends unasked, or the
        pipe fails (a frame that does not decode, on either end): the server cannot go on."""
        from torch_tensorrt_dist.serving.http import event_loop

        self.sock, self.build_app = sock, build_app
        self.state, self.metrics = state, metrics
        self.max_waiting = max_waiting
        self.host, self.port = sock.getsockname()[:2]
        self.loop = event_loop()
        ours, self._theirs = socket.socketpair()
        self.inbox = ForwardingInbox(Channel(ours, state))
        self.pid = 0
        self.on_lost = on_lost
        self._stopping = False
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def alive(self) -> bool:
        """Whether the child still runs (it can still answer what is open)."""
        if not self.pid:
            return False
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return done == 0

    def start(self) -> None:
        """Fork the child (it serves on ``sock``); read its messages in a thread of rank 0."""
        if not hasattr(os, "fork"):
            raise ConfigError(
                "torchtrt-dist serve runs its HTTP server in a forked process, and this "
                "platform has no os.fork: serve from Linux (or WSL)"
            )
        # the tokenizer's thread pool does not survive a fork: the child encodes alone
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        ours = self.inbox.channel.conn
        pid = os.fork()
        if pid == 0:  # the child: never returns
            ours.close()  # else rank 0's end stays open here, and its death is never seen
            _child(self.build_app, self.sock, self._theirs, self.max_waiting, self.loop)
        self.pid = pid
        self._theirs.close()
        self.metrics.threads.track("http", pid, pid=pid)  # the child's main thread
        self.state.listeners.append(lambda _: self.inbox.channel.send(("state",)))
        self.inbox.channel.send(("state",))
        self._reader = threading.Thread(target=self._read, name="http-pipe", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        fd = self.inbox.channel.conn.fileno()
        while True:
            try:
                message = ForkingPickler.loads(read_frame(fd))
            except (EOFError, OSError):
                self._lost(f"the HTTP process (pid {self.pid}) ended")
                return
            except Exception as exc:  # a frame that does not decode: the stream is lost
                logger.exception("rank 0 cannot read the HTTP process's pipe")
                self._lost(f"rank 0 cannot read the HTTP process's pipe: {_one_line(exc)}")
                return
            if message[0] == "failed":  # the child cannot read rank 0's messages
                self._lost(f"the HTTP process failed: {message[1]}")
                return
            try:
                self._handle(message)
            except Exception as exc:  # a bug: logged; the reader (and the child's sends) go on
                logger.exception("rank 0 failed to handle the HTTP process's %s", message[0])
                if message[0] == "submit":  # its client must not wait for ever
                    failed = Failed(500, f"the server failed to take the request: {exc}")
                    RemoteSink(message[1][0].sink.sid, self.inbox.channel).put(failed)
                    # the child counted its sequences as waiting: they never will
                    self.inbox.channel.send(("left", sum(sub.n for sub in message[1])))

    def _lost(self, reason: str) -> None:
        if not self._stopping and self.on_lost is not None:
            self.on_lost(reason)

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind, channel = message[0], self.inbox.channel
        if kind == "submit":
            subs = message[1]
            sink = cast(Sink, RemoteSink(subs[0].sink.sid, channel))  # deliver: by loop
            self.inbox.submit(*(replace(sub, sink=sink) for sub in subs))
        elif kind == "cancel":
            self.inbox.cancel(message[1])
        elif kind == "finished":
            self.inbox.finished(message[1])
        elif kind == "count":
            counter = getattr(self.metrics, message[1])
            (counter.labels(message[2]) if message[2] else counter).inc(message[3])
        elif kind == "scrape":
            self.metrics.queue_depth.set(message[2])
            channel.send(("scraped", message[1], self.metrics.render()))

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Tell the child to end its connections and exit; wait for it (then kill it)."""
        if not self.pid:
            return
        self._stopping = True
        self.inbox.channel.send(("stop",))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            logger.warning("the HTTP process did not stop within %.0f s: killing it", timeout_s)
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        self.pid = 0
        self.inbox.channel.close()
        if self._reader is not None:
            self._reader.join(1.0)  # it has seen the child's end: the pipe may close
        self.inbox.channel.conn.close()
        self.sock.close()


def _child(
    build_app: Callable[[ChildInbox, ServerState], Any],
    sock: socket.socket,
    conn: socket.socket,
    max_waiting: int,
    loop_name: str,
) -> None:
    """The child's whole life: serve until rank 0 says stop or goes away; then ``_exit``."""
    code = 0
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        signal.set_wakeup_fd(-1)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # its thread pool did not survive
        _close_fds_but(sock.fileno(), conn.fileno())
        gc.freeze()  # rank 0's heap: never scanned here (its pages stay shared)
        _serve(
            build_app(inbox := ChildInbox(Channel(conn), max_waiting), state := ServerState()),
            inbox,
            state,
            sock,
            conn,
            loop_name,
        )
    except BaseException:
        logger.exception("the HTTP process failed")
        code = 1
    finally:
        os._exit(code)


def _close_fds_but(*keep: int) -> None:
    """Close what the child inherited (rank 0's gloo sockets, the c10d store, files): a peer
    must see rank 0's connections close when rank 0 ends, not when this child does."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _serve(
    app: Any,
    inbox: ChildInbox,
    state: ServerState,
    sock: socket.socket,
    conn: socket.socket,
    loop_name: str,
) -> None:
    """uvicorn on ``sock``, with rank 0's messages read by the event loop itself."""
    import uvicorn

    from torch_tensorrt_dist.serving.http import uvicorn_config

    class _Server(uvicorn.Server):
        """uvicorn without its SIGINT/SIGTERM handlers: rank 0 drains, then says stop."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    server = _Server(uvicorn_config(app, loop_name))
    loop: asyncio.AbstractEventLoop
    if loop_name == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    fd, frames = conn.fileno(), FrameBuffer()
    os.set_blocking(fd, False)  # the event loop reads what has come; the writer resumes

    def on_message() -> None:
        match inbox.pump(fd, frames, state):
            case "stop":
                server.should_exit = True
            case "gone":
                loop.remove_reader(fd)
                server.should_exit = True
            case "failed":  # /health says why until rank 0 (told) ends the server
                loop.remove_reader(fd)
            case "open":
                pass

    loop.add_reader(fd, on_message)
    loop.run_until_complete(server.serve(sockets=[sock]))


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


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
