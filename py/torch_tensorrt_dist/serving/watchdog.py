"""Liveness of the step loop: a step that makes no progress fails the server, naming the rank.

    progress = StepProgress()                       # every rank; its step loop calls
    progress.begin(); ...; progress.end()           # around each step
    Heartbeat(store, rank, progress).start()        # ranks 1..N-1: a beat every beat_s
    dog = Watchdog(progress, PeerBeats(store, range(1, N)), timeout_s=60, on_hang=fail)
    dog.start()                                     # rank 0, once warm

A rank stuck in a collective waits for the collective timeout (10 minutes by default) and says
nothing meanwhile: ``/health`` said ready while a rank was stopped. Here rank 0's watchdog
thread sees its own step: when one has run for ``timeout_s`` without returning it decides
(:func:`judge`) which rank did not answer and calls ``on_hang`` (the server turns ``/health``
to 503, fails what is in flight naming that rank, and exits). To name it, every other rank runs
a heartbeat thread that writes ``"<beat> <steps begun> <steps ended>"`` into the c10d store
every ``beat_s``; rank 0 reads them at each poll and notes when each one last changed, on its
own clock. A rank whose beat stopped (a stopped or dead process, one that holds its
interpreter lock) is the one that did not answer; else a rank that has not begun rank 0's step,
else one that has not ended it; else rank 0 itself is stuck.

It depends only on a step counter that advances (:class:`StepProgress`) and the store: any
step loop that marks its steps can be watched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "BeatStore",
    "Heartbeat",
    "PeerBeat",
    "PeerBeats",
    "StepProgress",
    "Verdict",
    "Watchdog",
    "beat_interval",
    "judge",
    "stale_after",
]

logger = logging.getLogger(__name__)

KEY = "torchtrt_serve/beat/{rank}"


def beat_interval(timeout_s: float) -> float:
    """How often a heartbeat is written (and read): a tenth of the step timeout, at most 1 s."""
    return min(1.0, timeout_s / 10)


def stale_after(beat_s: float) -> float:
    """A heartbeat unchanged for longer has stopped: three beats missed, and at least 2 s (a
    loaded machine may run a beat late)."""
    return max(2.0, 3 * beat_s)


class StepProgress:
    """A rank's steps: how many begun and ended, and since when the current one runs (read
    by other threads; each field is written by the step loop alone)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.begun = 0
        self.ended = 0
        self.since: float | None = None
        """When the step that runs now began (None between steps)."""

    def begin(self) -> None:
        self.begun += 1
        self.since = self.clock()

    def end(self) -> None:
        self.ended = self.begun
        self.since = None


@dataclass(frozen=True)
class PeerBeat:
    """What rank 0 knows of another rank: its steps begun and ended at its last beat, and for
    how long its beat has not changed (None: never heard from)."""

    rank: int
    begun: int
    ended: int
    silent_s: float | None


@dataclass(frozen=True)
class Verdict:
    """Rank 0's step ``step`` made no progress for ``waited_s``: ``ranks`` did not answer."""

    step: int
    waited_s: float
    ranks: tuple[int, ...]
    why: str

    @property
    def rank(self) -> int:
        """The rank to blame first."""
        return self.ranks[0]

    def message(self) -> str:
        who = ", ".join(map(str, self.ranks))
        name = f"rank {who}" if len(self.ranks) == 1 else f"ranks {who}"
        return (
            f"step {self.step} made no progress for {self.waited_s:.1f} s: {name} did not "
            f"answer ({self.why})"
        )


def judge(step: int, waited_s: float, peers: Iterable[PeerBeat], *, stale_s: float) -> Verdict:
    """Who did not answer rank 0's step ``step`` (pure; see the module docstring)."""
    peers = sorted(peers, key=lambda p: p.rank)
    silent = [p for p in peers if p.silent_s is None or p.silent_s > stale_s]
    if silent:
        ages = [f"{p.silent_s:.1f} s ago" if p.silent_s is not None else "never" for p in silent]
        why = f"its heartbeat stopped {ages[0]}: the process is stopped, dead or stuck"
        if len(silent) > 1:
            why = f"their heartbeats stopped ({', '.join(ages)}): stopped, dead or stuck"
        return Verdict(step, waited_s, tuple(p.rank for p in silent), why)
    behind = [p for p in peers if p.begun < step]
    if behind:
        where = ", ".join(f"{p.begun}" for p in behind)
        why = f"alive, but it has not begun step {step} (it is in step {where})"
        return Verdict(step, waited_s, tuple(p.rank for p in behind), why)
    inside = [p for p in peers if p.ended < step]
    if inside:
        why = f"alive, but its step {step} does not return (a collective or its compute)"
        return Verdict(step, waited_s, tuple(p.rank for p in inside), why)
    why = "every other rank has ended this step: rank 0's own step does not return"
    return Verdict(step, waited_s, (0,), why)


class BeatStore(Protocol):
    """What the beats need of a key-value store: the c10d store's ``set``, ``check``, ``get``
    (``torch.distributed.Store``)."""

    def set(self, key: str, value: str) -> None: ...

    def check(self, keys: list[str]) -> bool: ...

    def get(self, key: str) -> bytes: ...


class Heartbeat:
    """A daemon thread writing this rank's beat into ``store`` every ``beat_s``."""

    def __init__(
        self, store: BeatStore, rank: int, progress: StepProgress, *, beat_s: float
    ) -> None:
        self.store, self.rank, self.progress, self.beat_s = store, rank, progress, beat_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.beat(0)  # heard from before the watchdog starts
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self, n: int) -> None:
        p = self.progress
        self.store.set(KEY.format(rank=self.rank), f"{n} {p.begun} {p.ended}")

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.beat_s):
            n += 1
            try:
                self.beat(n)
            except Exception as exc:  # the store (rank 0) has gone: the step loop will know
                logger.debug("heartbeat of rank %d stopped: %s", self.rank, exc)
                return


class PeerBeats:
    """Rank 0's view of the other ranks' heartbeats (``poll`` from one thread only)."""

    def __init__(
        self, store: BeatStore, ranks: Iterable[int], clock: Callable[[], float] = time.monotonic
    ):
        self.store, self.ranks, self.clock = store, list(ranks), clock
        self._last: dict[int, tuple[str, float]] = {}  # rank -> (its beat's text, when it changed)

    def poll(self) -> None:
        now = self.clock()
        for r in self.ranks:
            key = KEY.format(rank=r)
            try:
                if not self.store.check([key]):
                    continue
                text = self.store.get(key).decode()
            except Exception as exc:  # the store should be local (rank 0 hosts it)
                logger.debug("cannot read the heartbeat of rank %d: %s", r, exc)
                continue
            if self._last.get(r, ("", 0.0))[0] != text:
                self._last[r] = (text, now)

    def beats(self) -> list[PeerBeat]:
        now = self.clock()
        out = []
        for r in self.ranks:
            if r not in self._last:
                out.append(PeerBeat(r, 0, 0, None))
                continue
            text, changed = self._last[r]
            _, begun, ended = (int(x) for x in text.split())
            out.append(PeerBeat(r, begun, ended, now - changed))
        return out


class Watchdog:
    """Rank 0's thread: ``on_hang(verdict)`` once a step has run ``timeout_s`` (see the module
    docstring). ``verdict()`` judges now, whatever the time (a collective that failed: who
    did not answer)."""

    def __init__(
        self,
        progress: StepProgress,
        peers: PeerBeats | None,
        *,
        timeout_s: float,
        on_hang: Callable[[Verdict], None],
    ) -> None:
        self.progress, self.peers, self.timeout_s = progress, peers, timeout_s
        self.on_hang = on_hang
        self.poll_s = beat_interval(timeout_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def verdict(self) -> Verdict | None:
        """Who did not answer the step that runs now (None between steps)."""
        since, step = self.progress.since, self.progress.begun
        if since is None:
            return None
        with self._lock:
            beats = self.peers.beats() if self.peers is not None else []
        waited = self.progress.clock() - since
        return judge(step, waited, beats, stale_s=stale_after(self.poll_s))

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.peers is not None:
                with self._lock:
                    self.peers.poll()
            since = self.progress.since
            if since is not None and self.progress.clock() - since > self.timeout_s:
                verdict = self.verdict()
                if verdict is not None:
                    self.on_hang(verdict)
                    return
