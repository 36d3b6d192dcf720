"""The step loop every rank runs; rank 0 also schedules requests and publishes their text.

    StepLoop(slots, channel).follow()                            # ranks 1..N-1
    Leader(StepLoop(slots, channel), inbox, state, ...).run()    # rank 0

A step is: one control exchange (``control.py``), then on every rank the same cancels and
joins (each join's prefill samples the request's first token), then one decode of every running
row. Rank 0 publishes the joins' first tokens before the decode, and the decode's tokens once
the next step's header has gone out (their text, where no stop string needs it to decide the
finish, is decoded only then: the other ranks need not wait for it). Requests wait in rank 0's
FIFO until a slot is free; slots are given lowest first.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.slots import Emitted, Request, Slots
from torch_tensorrt_dist.serving.bridge import (
    Cancel,
    Failed,
    Inbox,
    Piece,
    ServerState,
    Sink,
    Submission,
    deliver,
)
from torch_tensorrt_dist.serving.control import ControlChannel, StepEvents
from torch_tensorrt_dist.serving.isolation import row_failure
from torch_tensorrt_dist.serving.watchdog import StepProgress

__all__ = ["Leader", "StepLoop", "StepStats"]

logger = logging.getLogger(__name__)


@dataclass
class StepStats:
    """Totals over the steps that decoded (steady steps), per rank."""

    steps: int = 0
    step_s: float = 0.0
    control_s: float = 0.0
    rows: int = 0

    def add(self, step_s: float, control_s: float, rows: int) -> None:
        self.steps += 1
        self.step_s += step_s
        self.control_s += control_s
        self.rows += rows

    def summary(self, rank: int, payload_steps: int) -> str:
        if not self.steps:
            return f"rank {rank}: no decode steps"
        share = 100 * self.control_s / self.step_s if self.step_s else 0.0
        return (
            f"rank {rank}: {self.steps} decode steps, {self.rows / self.steps:.1f} rows each, "
            f"{1e3 * self.step_s / self.steps:.2f} ms per step, control channel "
            f"{1e3 * self.control_s / self.steps:.3f} ms per step ({share:.2f} %), "
            f"payloads on {payload_steps} steps"
        )


class StepLoop:
    """The core's step on one rank: apply a step's events, then decode."""

    def __init__(self, slots: Slots, channel: ControlChannel) -> None:
        self.slots, self.channel = slots, channel
        self.stats = StepStats()
        #: steps begun and ended, read by the heartbeat and the watchdog (``watchdog.py``)
        self.progress = StepProgress()
        #: (step s, control s) of the last step when it decoded, else None
        self.last: tuple[float, float] | None = None

    def apply(self, events: StepEvents) -> tuple[list[Emitted], list[tuple[int, str]]]:
        """Cancels, then joins; returns what the joins emitted and the joins refused (the same
        on every rank: the checks are functions of the request)."""
        emitted, refused = [], []
        for rid in events.cancels:
            self.slots.cancel(rid)
        for slot, req in events.joins:
            try:
                emitted.append(self.slots.join(req, slot))
            except ConfigError as exc:
                refused.append((req.rid, str(exc)))
        return emitted, refused

    def decode(self, step_start: float) -> list[Emitted]:
        self.last = None
        if not self.slots.active:
            return []
        rows = self.slots.active
        out = self.slots.decode()
        self.last = (time.perf_counter() - step_start, self.channel.last_s)
        self.stats.add(*self.last, rows)
        return out

    def follow(self) -> None:
        """Ranks other than 0: run every step rank 0 announces, until it says stop."""
        while True:
            self.progress.begin()
            start = time.perf_counter()
            events = self.channel.exchange()
            self.apply(events)
            self.decode(start)
            self.progress.end()
            if events.stop:
                return


class Leader:
    """Rank 0: admits requests into free slots, announces each step, publishes the text."""

    def __init__(
        self,
        loop: StepLoop,
        inbox: Inbox,
        state: ServerState,
        *,
        stop_ids: tuple[int, ...],
        idle_tick_s: float = 0.5,
        drain_timeout_s: float = 20.0,
        on_step: Callable[[Leader], None] | None = None,
        on_token: Callable[[Submission, float, float | None], None] | None = None,
    ) -> None:
        self.loop, self.inbox, self.state = loop, inbox, state
        self.stop_ids, self.idle_tick_s = stop_ids, idle_tick_s
        self.drain_timeout_s = drain_timeout_s
        self.on_step, self.on_token = on_step, on_token
        self.waiting: deque[Submission] = deque()
        self.running: dict[int, Submission] = {}
        self._last_token: dict[int, float] = {}
        #: a decode step's output, published once the next step's header has gone out
        self._pending: list[tuple[Submission, Emitted]] = []
        self._deadline: float | None = None
        self._seeds = random.SystemRandom()
        #: requests that failed alone (``Emitted.error``): cancelled on every rank at the next
        #: step (a no-op where the core freed the row already)
        self._dropped: list[int] = []

    def run(self) -> None:
        """Steps until a drain (``state`` draining) has finished; raises on a failed rank.

        The text of a decode step is rendered and handed to HTTP after the next step's control
        header has gone out, so the other ranks start that step while rank 0 detokenizes (a
        join's first token is still published before the step's decode)."""
        self.loop.slots.defer_text = True
        while True:
            if self._pending and not self.loop.slots.active:
                self._publish(self._pending)  # no step follows: tell them before waiting idle
                self._pending = []
            events = self._plan()
            self.loop.progress.begin()  # the watchdog times the step from here
            start = time.perf_counter()
            events = self.loop.channel.exchange(events)
            self._publish(self._pending)
            self._pending = []
            emitted, refused = self.loop.apply(events)
            for rid, message in refused:
                self.running.pop(rid).sink.put(Failed(400, message))
            self._publish(self._collect(emitted))
            self._pending = self._collect(self.loop.decode(start))
            if self.on_step is not None:
                self.on_step(self)
            self.loop.progress.end()
            if events.stop:
                self._publish(self._pending)
                return

    def fail_all(self, status: int, message: str) -> None:
        """Answer every request queued, waiting or running (a rank failed). The last decode
        step's output is valid and is published first: a request it finished gets its whole
        answer, a running one its piece before the failure."""
        self.waiting.extend(i for i in self.inbox.take(0.0) if isinstance(i, Submission))
        failed = [*self.waiting, *self.running.values()]
        try:
            self._publish(self._pending)
        except Exception:  # the failure must still be told: those the step finished get it too
            logger.exception("publishing the last step's text failed")
            failed += [sub for sub, e in self._pending if e.finish is not None]
        deliver([(sub.sink, Failed(status, message)) for sub in failed])
        self.inbox.left(len(self.waiting))
        self.waiting.clear()
        self.running.clear()
        self._pending = []
        self._last_token.clear()

    def _plan(self) -> StepEvents:
        busy = self.loop.slots.active or self.waiting
        events = StepEvents(cancels=self._dropped)
        self._dropped = []
        for item in self.inbox.take(0.0 if busy else self.idle_tick_s):
            if isinstance(item, Submission):
                self.waiting.append(item)
            elif isinstance(item, Cancel):
                self._cancel(item.rid, events)
        if self.state.state == "draining":
            return self._drain(events)
        free = self.loop.slots.free_slots()
        while self.waiting and free:
            sub = self.waiting.popleft()
            self.inbox.left()
            seed = sub.seed if sub.seed is not None else self._seeds.randrange(2**31)
            req = Request(
                sub.rid,
                sub.prompt,
                sub.max_new_tokens,
                replace(sub.sampling, seed=seed),
                self.stop_ids,
                sub.stop,
            )
            events.joins.append((free.pop(0), req))
            self.running[sub.rid] = sub
        return events

    def _cancel(self, rid: int, events: StepEvents) -> None:
        for sub in self.waiting:
            if sub.rid == rid:
                self.waiting.remove(sub)
                self.inbox.left()
                return
        if rid in self.running:
            events.cancels.append(rid)
            self.running.pop(rid)
            self._last_token.pop(rid, None)

    def _drain(self, events: StepEvents) -> StepEvents:
        """Refuse what waits; let the running rows finish until the deadline; then stop."""
        for sub in self.waiting:
            sub.sink.put(Failed(503, "the server is shutting down; retry elsewhere"))
        self.inbox.left(len(self.waiting))
        self.waiting.clear()
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.drain_timeout_s
        if self.loop.slots.active and now < self._deadline:
            return events
        # the last step's text first, then the 503s: a client stops reading at its Failed
        timeout = Failed(503, "the server stopped (drain timeout) before this finished")
        self._publish(self._pending, then=[(sub.sink, timeout) for sub in self.running.values()])
        self._pending = []
        events.cancels.extend(self.running)
        for rid in self.running:
            self._last_token.pop(rid, None)
        self.running.clear()
        events.stop = True
        return events

    def _collect(self, emitted: list[Emitted]) -> list[tuple[Submission, Emitted]]:
        """The running requests' part of ``emitted``; those that finished stop running here
        (their slots are free already)."""
        out = []
        for e in emitted:
            sub = self.running.get(e.rid)
            if sub is None:
                continue  # cancelled in this very step
            out.append((sub, e))
            if e.finish is not None:
                del self.running[e.rid]
        return out

    def _publish(
        self, items: list[tuple[Submission, Emitted]], then: Sequence[tuple[Sink, Failed]] = ()
    ) -> None:
        """Render the text of ``items`` and hand it to HTTP, then ``then`` (one wake-up of its
        loop, in this order)."""
        if not items and not then:
            return
        self.loop.slots.render()
        now = time.perf_counter()
        pieces: list[tuple[Sink, Piece | Failed]] = []
        for sub, e in items:
            if e.error is not None:  # this request failed alone; the others go on
                failure = row_failure(e.error, sampling=sub.sampling, stop=sub.stop)
                pieces.append((sub.sink, failure))
                self.inbox.finished(e.rid)
                self._dropped.append(e.rid)
                self.running.pop(e.rid, None)
                self._last_token.pop(e.rid, None)
                continue
            if self.on_token is not None:  # (request, now, the previous token's time or None)
                self.on_token(sub, now, self._last_token.get(e.rid))
            if e.finish is None and e.rid in self.running:
                self._last_token[e.rid] = now
            else:  # it finished, or it was cancelled after this step
                self._last_token.pop(e.rid, None)
            pieces.append((sub.sink, Piece(e.text, len(e.tokens), e.finish)))
            if e.finish is not None:
                self.inbox.finished(e.rid)  # answered: nothing left to fail (``fail_live``)
        deliver([*pieces, *then])
