"""The server's liveness parts without a server: the watchdog's decision and its threads (a
fake store and clock), a SIGTERM seen while the main thread is stuck in native code, the
connection cap and the quiet log filter, and answering every request in flight from any
thread."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")

from torch_tensorrt_dist.serving.bridge import Failed, Inbox, Submission
from torch_tensorrt_dist.serving.connections import OncePerCause, connection_cap, raw_response
from torch_tensorrt_dist.serving.watchdog import (
    Heartbeat,
    PeerBeat,
    PeerBeats,
    StepProgress,
    Watchdog,
    beat_interval,
    judge,
    stale_after,
)


def test_judge_names_the_rank_that_did_not_answer() -> None:
    alive = PeerBeat(1, begun=7, ended=7, silent_s=0.4)
    stopped = PeerBeat(2, begun=7, ended=6, silent_s=9.0)
    v = judge(7, 12.0, [alive, stopped], stale_s=2.0)
    assert v.ranks == (2,) and "heartbeat stopped 9.0 s ago" in v.why
    assert v.message().startswith("step 7 made no progress for 12.0 s: rank 2 did not answer")
    never = judge(7, 12.0, [PeerBeat(3, 0, 0, None), stopped], stale_s=2.0)
    assert never.ranks == (2, 3) and "never" in never.why and "ranks 2, 3" in never.message()
    behind = judge(7, 12.0, [alive, PeerBeat(2, begun=6, ended=6, silent_s=0.1)], stale_s=2.0)
    assert behind.ranks == (2,) and "has not begun step 7 (it is in step 6)" in behind.why
    inside = judge(7, 12.0, [alive, PeerBeat(2, begun=7, ended=6, silent_s=0.1)], stale_s=2.0)
    assert inside.ranks == (2,) and "does not return" in inside.why
    me = judge(7, 12.0, [alive], stale_s=2.0)
    assert me.ranks == (0,) and "rank 0's own step" in me.why
    assert judge(3, 1.0, [], stale_s=2.0).rank == 0  # one rank: only itself
    assert (beat_interval(60), beat_interval(3), stale_after(1.0), stale_after(0.3)) == (
        1.0,
        0.3,
        3.0,
        2.0,
    )


class _Store:
    """The c10d store calls the heartbeat and the watchdog use."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)


def test_peer_beats_note_when_each_beat_last_changed() -> None:
    store, now = _Store(), [100.0]
    peers = PeerBeats(store, [1, 2], clock=lambda: now[0])
    progress = StepProgress()
    beat = Heartbeat(store, 1, progress, beat_s=0.1)
    beat.beat(0)
    peers.poll()
    assert peers.beats() == [PeerBeat(1, 0, 0, 0.0), PeerBeat(2, 0, 0, None)]
    progress.begin()
    progress.end()
    progress.begin()
    now[0] = 101.0
    beat.beat(1)  # rank 1: 2 steps begun, 1 ended
    peers.poll()
    now[0] = 104.5  # then silent for 3.5 s
    peers.poll()
    assert peers.beats()[0] == PeerBeat(1, 2, 1, 3.5)


def test_the_watchdog_fires_once_a_step_runs_past_the_timeout() -> None:
    store = _Store()
    mine, theirs = StepProgress(), StepProgress()
    Heartbeat(store, 1, theirs, beat_s=0.05).start()
    verdicts: list[Any] = []
    fired = threading.Event()
    dog = Watchdog(
        mine,
        PeerBeats(store, [1]),
        timeout_s=0.5,
        on_hang=lambda v: (verdicts.append(v), fired.set()),
    )
    dog.start()
    for _ in range(3):  # quick steps: nothing fires
        mine.begin()
        theirs.begin()
        time.sleep(0.05)
        theirs.end()
        mine.end()
    assert dog.verdict() is None and not fired.is_set()
    mine.begin()  # rank 1 never begins this one
    start = time.monotonic()
    assert fired.wait(5)
    assert 0.5 <= time.monotonic() - start < 3
    assert verdicts[0].ranks == (1,) and "not begun step 4 (it is in step 3)" in verdicts[0].why
    dog.stop()


def test_a_signal_is_seen_while_the_main_thread_is_stuck_in_native_code() -> None:
    """Python runs a signal handler only between bytecodes; a main thread blocked in a C
    call (here a mutex locked twice: glibc restarts the wait after a signal) never gets
    there. The wakeup socket's thread still sees it, and the deadline fires."""
    child = textwrap.dedent(
        """
        import ctypes, os, sys, time
        from torch_tensorrt_dist.serving.signals import StopSignals
        signals = StopSignals()
        def seen(sig):
            print("seen", sig, flush=True)
        def late():
            print("late", flush=True)
            os._exit(7)
        signals.on_signal(seen)
        signals.deadline(0.3, late)
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)
        libc.pthread_mutex_lock(mutex)
        print("stuck", flush=True)
        libc.pthread_mutex_lock(mutex)  # never returns
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "stuck"
    proc.terminate()
    assert proc.wait(20) == 7
    assert proc.stdout.read().split() == ["seen", "15", "late"]


def test_a_stuck_rank_past_its_deadline_ends_by_the_signal() -> None:
    """What a rank other than 0 runs at its deadline (``signals.end_by_first``, in the timer's
    thread while the main thread is stuck): the process ends by the signal it got, which the
    launcher does not blame (``signal.signal`` raises ValueError outside the main thread)."""
    child = textwrap.dedent(
        """
        import ctypes
        from torch_tensorrt_dist.serving.signals import StopSignals, end_by_first
        signals = StopSignals()
        signals.deadline(0.3, lambda: end_by_first(signals))
        libc = ctypes.CDLL(None)
        mutex = ctypes.create_string_buffer(64)
        libc.pthread_mutex_lock(mutex)
        print("stuck", flush=True)
        libc.pthread_mutex_lock(mutex)  # never returns
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == "stuck"
    proc.terminate()
    assert proc.wait(20) == -15, proc.stderr.read()[-2000:]
    assert "Traceback" not in proc.stderr.read()


def test_connection_cap_and_raw_responses() -> None:
    assert connection_cap(20000) == 1024
    assert connection_cap(1024) == 1024 - 128
    assert connection_cap(100) == 1
    raw = raw_response(503, "busy", retry_after="1").decode()
    head, body = raw.split("\r\n\r\n")
    assert head.startswith("HTTP/1.1 503 Service Unavailable\r\n")
    assert "retry-after: 1" in head and f"content-length: {len(body)}" in head
    assert '"type": "service_unavailable"' in body and '"message": "busy"' in body


def test_once_per_cause_lets_one_record_through_per_interval() -> None:
    now = [0.0]
    filt = OncePerCause(interval_s=60.0, clock=lambda: now[0])
    log = logging.getLogger("test_serve_liveness.quiet")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log.addHandler(Keep())
    log.addFilter(filt)
    log.propagate = False
    for _ in range(1000):
        log.warning("Invalid HTTP request received.")
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            log.error("socket.accept() out of system resource", exc_info=True)
    assert [r.getMessage() for r in records] == [
        "Invalid HTTP request received.",
        "socket.accept() out of system resource",
    ]
    now[0] = 61.0
    log.warning("Invalid HTTP request received.")
    assert records[-1].getMessage() == (
        "Invalid HTTP request received. (999 more like this in the last 60 s)"
    )


def test_fail_live_answers_every_request_not_answered_yet() -> None:
    class Sink:
        def __init__(self) -> None:
            self.items: list[Any] = []

        def put(self, item: Any) -> None:
            self.items.append(item)

    from torch_tensorrt_dist.generation.sampling import SamplingConfig

    inbox = Inbox(8)
    sinks = [Sink() for _ in range(3)]
    subs = [Submission((1,), 1, SamplingConfig(), None, (), s) for s in sinks]  # type: ignore[arg-type]
    for sub in subs:
        inbox.submit(sub)
    inbox.finished(subs[1].rid)  # answered already
    assert inbox.fail_live(503, "rank 1 did not answer") == 2
    assert sinks[1].items == [] and inbox.fail_live(503, "again") == 0
    assert all(s.items == [Failed(503, "rank 1 did not answer")] for s in (sinks[0], sinks[2]))
