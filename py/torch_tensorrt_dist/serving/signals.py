"""SIGTERM / SIGINT for a server rank, seen at once even while its main thread is stuck.

    signals = StopSignals()                    # first thing on every rank (main thread)
    signals.on_signal(lambda sig: state.set("draining"))    # rank 0, once it has a state
    signals.deadline(25.0, on_late)            # on_late() if the process still runs 25 s after
    end_by_first(signals)                      # from any thread: the process ends by that signal

Python runs a signal handler only when the main thread comes back to the interpreter; a main
thread blocked in a collective (a peer that hangs) would never see the SIGTERM: no drain, no
503s, until the launcher kills the rank. Here the C-level handler also writes the signal's
number to a socket (``signal.set_wakeup_fd``) that a daemon thread reads: it calls
``on_signal`` at once, and starts the deadline. Installed before the model loads, so a SIGTERM
during loading or warm-up is noted (and answered once warm) rather than killing the rank
half-way while its peers wait in a collective.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["StopSignals", "default_action", "end_by_first"]

logger = logging.getLogger(__name__)

STOP = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """The first SIGTERM/SIGINT this process received (``first``), and what it starts."""

    def __init__(self) -> None:
        self.first: int | None = None
        self._callbacks: list[Callable[[int], None]] = []
        self._late: tuple[float, Callable[[], None]] | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._r, self._w = socket.socketpair()
        self._w.setblocking(False)
        for sig in STOP:
            signal.signal(sig, self._handle)
        signal.set_wakeup_fd(self._w.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="signals", daemon=True).start()

    def on_signal(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(signum)`` at the first signal (at once if it came already)."""
        with self._lock:
            self._callbacks.append(callback)
            first = self.first
        if first is not None:
            callback(first)

    def deadline(self, seconds: float, on_late: Callable[[], None]) -> None:
        """Call ``on_late()`` (from a thread) ``seconds`` after the first signal, unless
        :meth:`cancel` was called first (the rank ended in time)."""
        with self._lock:
            self._late = (seconds, on_late)
            first = self.first
        if first is not None:
            self._start_timer()

    def cancel(self) -> None:
        with self._lock:
            self._late = None
            if self._timer is not None:
                self._timer.cancel()

    def _handle(self, signum: int, _: FrameType | None) -> None:
        self._note(signum)  # the main thread came back: usually the watch thread was first

    def _watch(self) -> None:
        while True:
            try:
                data = self._r.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in STOP:
                    self._note(signum)

    def _note(self, signum: int) -> None:
        with self._lock:
            if self.first is not None:
                return
            self.first = signum
            callbacks = list(self._callbacks)
        logger.info("signal %d: stopping", signum)
        for callback in callbacks:
            callback(signum)
        self._start_timer()

    def _start_timer(self) -> None:
        with self._lock:
            if self._late is None or self._timer is not None:
                return
            seconds, on_late = self._late
            self._timer = threading.Timer(seconds, on_late)
            self._timer.daemon = True
            self._timer.start()


def end_by_first(signals: StopSignals) -> None:
    """A rank other than 0 still running long after a signal: end it by that signal (a stop,
    which the launcher does not blame)."""
    sig = signals.first or signal.SIGTERM
    logger.warning("still running past the drain deadline after signal %d: ending the rank", sig)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    default_action(sig)
    os.kill(os.getpid(), sig)


def default_action(sig: int) -> None:
    """Give ``sig`` its default action (ending the process) from any thread.

    ``signal.signal`` works in the main thread only (ValueError elsewhere), and
    :func:`end_by_first` runs in the deadline's timer thread while the main thread is stuck in a
    collective: there, the C library's ``signal`` does it (Python's own handler table is left
    stale, which does not matter to a process about to end)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(sig, signal.SIG_DFL)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    if libc.signal(int(sig), None) == ctypes.c_void_p(-1).value:  # SIG_ERR
        os._exit(128 + int(sig))  # the exit status a shell gives a process ended by sig
