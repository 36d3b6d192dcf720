"""When each rank on this node ended, and how, seen by the launcher itself.

    with ExitWatch(failure_dir) as watch:     # ranks find the socket through the folder
        run_the_ranks()
    events = watch.events()                    # {rank: ExitEvent}

Every rank's trampoline (``_rank_entry.announce``) connects to a Unix socket in the launch's
failure folder and says ``<rank> <pid>``; it says ``exit <code>`` when it ends through the
trampoline. The kernel closes the connection the moment the process dies, however it dies, so
the launcher learns the order in which the ranks ended even when the process that started them
(mpirun) reports another: under load, mpirun reaps a killed rank and the peer that lost it in
one go and names the peer (its exit code) as the job's first failure. For a rank that ended
without a word, the watch reads its wait status from ``/proc/<pid>/stat`` while the process is
a zombie (until mpirun or torchrun's agent reaps it): the signal that killed it.

Ranks on other nodes (mpirun over a hostfile) cannot reach the socket; they are not watched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time

from torch_tensorrt_dist.runtime._rank_entry import EXIT_SOCKET_NAME
from torch_tensorrt_dist.runtime.failures import ExitEvent

__all__ = ["ExitWatch", "parse_proc_stat"]

logger = logging.getLogger(__name__)

#: How long the watch looks for a zombie's wait status after its connection closed.
_ZOMBIE_WAIT_S = 0.5


def proc_stat_fields(text: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` (or ``/proc/self/task/<tid>/stat``) text after the
    command name, from the state (proc(5)'s field 3) on (pure; [] for a text without one)."""
    end = text.rfind(")")  # the command name (field 2) may hold spaces and parentheses
    return text[end + 2 :].split() if end >= 0 else []


def parse_proc_stat(text: str) -> tuple[str, int] | None:
    """``(state, wait status)`` from the text of ``/proc/<pid>/stat`` (pure); the wait status
    (field 52, Linux 3.5 and later) is the process's exit status once it is a zombie."""
    fields = proc_stat_fields(text)
    if len(fields) < 50:
        return None
    try:
        return fields[0], int(fields[49])
    except ValueError:
        return None


def _wait_status(pid: int) -> tuple[int | None, int | None] | None:
    """``(exit_code, signal)`` of a zombie; None while it runs or once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            parsed = parse_proc_stat(fh.read())
    except OSError:
        return None
    if parsed is None or parsed[0] != "Z":
        return None
    status = parsed[1]
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return os.WEXITSTATUS(status), None


class _Peer:
    def __init__(self) -> None:
        self.buffer = b""
        self.rank: int | None = None
        self.pid: int | None = None
        self.code: int | None = None

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            words = line.decode("ascii", "replace").split()
            with contextlib.suppress(ValueError, IndexError):
                if words[0] == "exit":
                    self.code = int(words[1])
                elif self.rank is None:
                    self.rank, self.pid = int(words[0]), int(words[1])


class ExitWatch:
    """Listens on ``<folder>/exits.sock`` while the ranks run (a daemon thread)."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, EXIT_SOCKET_NAME)
        self._events: dict[int, ExitEvent] = {}
        self._lock = threading.Lock()
        self._host = socket.gethostname()
        self._server: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ExitWatch:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(self.path)
            server.listen(128)
        except OSError as exc:  # a path too long for a Unix socket: no watch, records decide
            server.close()
            logger.debug("no exit watch at %s: %s", self.path, exc)
            return self
        server.setblocking(False)
        self._server = server
        self._thread = threading.Thread(target=self._loop, name="exit-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._wake_w.send(b"x")
            self._thread.join(5)
        for s in (self._server, self._wake_r, self._wake_w):
            if s is not None:
                s.close()

    def events(self) -> dict[int, ExitEvent]:
        with self._lock:
            return dict(self._events)

    def _ended(self, peer: _Peer, when: float) -> None:
        if peer.rank is None:
            return
        event = ExitEvent(
            peer.rank,
            when,
            said=peer.code is not None,
            exit_code=peer.code,
            pid=peer.pid,
            host=self._host,
        )
        with self._lock:
            self._events.setdefault(peer.rank, event)

    def _settle(self, pending: dict[int, float]) -> None:
        """Read the wait status of ranks that ended without a word, while they are zombies."""
        now = time.monotonic()
        for rank, deadline in list(pending.items()):
            with self._lock:
                event = self._events[rank]
            status = _wait_status(event.pid) if event.pid else None
            if status is not None:
                code, sig = status
                with self._lock:
                    self._events[rank] = ExitEvent(
                        rank,
                        event.time,
                        exit_code=code,
                        signal=sig,
                        pid=event.pid,
                        host=event.host,
                    )
            if status is not None or now > deadline:
                del pending[rank]

    def _handle(
        self, sel: selectors.BaseSelector, key: selectors.SelectorKey, pending: dict[int, float]
    ) -> None:
        assert self._server is not None
        if key.data is None:
            with contextlib.suppress(OSError):
                accepted, _ = self._server.accept()
                sel.register(accepted, selectors.EVENT_READ, _Peer())
            return
        conn, peer = key.fileobj, key.data
        if not isinstance(conn, socket.socket) or not isinstance(peer, _Peer):
            return
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if data:
            peer.feed(data)
            return
        self._ended(peer, time.time())
        sel.unregister(conn)
        conn.close()
        if peer.rank is not None and peer.code is None:
            pending[peer.rank] = time.monotonic() + _ZOMBIE_WAIT_S

    def _loop(self) -> None:
        assert self._server is not None
        sel = selectors.DefaultSelector()
        sel.register(self._server, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        pending: dict[int, float] = {}
        stopping = False
        while True:
            ready = sel.select(0 if stopping else (0.005 if pending else None))
            for key, _ in ready:
                if key.data == "wake":
                    stopping = True
                    sel.unregister(self._wake_r)
                else:
                    self._handle(sel, key, pending)
            if pending:
                self._settle(pending)
            if stopping and not ready:  # the launch is over: what was ready is read
                break
        for key in list(sel.get_map().values()):
            if key.fileobj is not self._server:
                key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
