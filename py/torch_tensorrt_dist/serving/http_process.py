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
chat template, grammar engine and request checks, and never runs a tensor operation. The messages
between them: ``frontend.py``. When rank 0 is killed, the child's pipe closes: every open
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
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, cast

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving.bridge import Failed, ServerState, Sink
from torch_tensorrt_dist.serving.frames import FrameBuffer, read_frame
from torch_tensorrt_dist.serving.frontend import (
    Channel,
    ChildInbox,
    ForwardingInbox,
    RemoteSink,
    one_line,
)
from torch_tensorrt_dist.serving.metrics import Metrics

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["HttpProcess"]

logger = logging.getLogger(__name__)

#: seconds the child may take to end its connections once told to stop
STOP_TIMEOUT_S = 5.0


class HttpProcess:
    """The HTTP app served by a forked child of rank 0 (see the module docstring)."""

    def __init__(
        self,
        build_app: Callable[[ChildInbox, ServerState], FastAPI],
        sock: socket.socket,
        state: ServerState,
        metrics: Metrics,
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
        self._seen = "warming"  # the last state the child said it applied
        self._seen_changed = threading.Condition()

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
                self._lost(f"rank 0 cannot read the HTTP process's pipe: {one_line(exc)}")
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
        elif kind == "seen":
            with self._seen_changed:
                self._seen = message[1]
                self._seen_changed.notify_all()
        elif kind == "scrape":
            self.metrics.queue_depth.set(message[2])
            channel.send(("scraped", message[1], self.metrics.render()))

    def told(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the child has applied a state past "warming":
        until then its ``/health`` and requests answer 503 "warming up", so the server's
        "serving ... at URL" line waits for it (a client that starts on that line would meet
        the 503s). False if it did not within ``timeout_s``."""
        with self._seen_changed:
            return self._seen_changed.wait_for(lambda: self._seen != "warming", timeout_s)

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
    build_app: Callable[[ChildInbox, ServerState], FastAPI],
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
        fresh_torch_pool()
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


def fresh_torch_pool() -> None:
    """Rebuild torch's intra-op thread pool in a forked child while it has one thread. After a
    fork torch replaces the pool at its next use, and two threads that use it first at once
    race there ("pool INTERNAL ASSERT FAILED ... Invalid thread pool!"): the child's request
    threads do (``prepare``'s grammar checks run tensor ops)."""
    import torch

    torch.set_num_threads(torch.get_num_threads())


def _close_fds_but(*keep: int) -> None:
    """Close what the child inherited (rank 0's gloo sockets, the c10d store, files): a peer
    must see rank 0's connections close when rank 0 ends, not when this child does."""
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _serve(
    app: FastAPI,
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
