"""The step loop every rank runs; rank 0 also schedules requests and publishes their text.

    StepLoop(core, channel).follow()                                     # ranks 1..N-1
    Leader(StepLoop(core, channel), scheduler, inbox, state, ...).run()  # rank 0

A step is: rank 0's scheduler plans it (``generation/scheduler.py``: cancels, preemptions,
admissions, prefill chunks; the running requests decode), one control exchange carries the
plan (``control.py``), then every rank's core applies it (``generation/core.py``: the same
blocks, the same rows, the same tokens). Rank 0 publishes a step's tokens once the next step's
header has gone out (their text, where no stop string needs it to decide the finish, is decoded
only then: the other ranks need not wait for it). Requests wait in the scheduler's FIFO until
a row, the step's prefill budget and KV blocks allow. A submission of ``n`` sequences (``n``
choices, or ``best_of`` candidates) is ``n`` requests of the core, choice ``j`` seeded with the
seed + ``j`` and following choice 0 (it takes choice 0's prompt blocks from the prefix cache);
its pieces carry the sequence's index, and one failed sequence fails the whole submission.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.core import Emitted, GenerationCore, Request
from torch_tensorrt_dist.generation.plan import StepPlan
from torch_tensorrt_dist.generation.scheduler import Scheduler
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
from torch_tensorrt_dist.serving.control import ControlChannel
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
    """The core's step on one rank: apply the step's plan (its rows run in it)."""

    def __init__(self, core: GenerationCore, channel: ControlChannel) -> None:
        self.core, self.channel = core, channel
        self.stats = StepStats()
        #: steps begun and ended, read by the heartbeat and the watchdog (``watchdog.py``)
        self.progress = StepProgress()
        #: (step s, control s) of the last step when it ran rows, else None
        self.last: tuple[float, float] | None = None

    def apply(self, plan: StepPlan, step_start: float) -> list[Emitted]:
        self.last = None
        rows = self.core.active + len(plan.joins) + len(plan.resumes)
        if not rows and not plan.cancels:
            return []
        out = self.core.step(plan)
        if self.core.active or out:
            self.last = (time.perf_counter() - step_start, self.channel.last_s)
            self.stats.add(*self.last, rows)
        return out

    def follow(self) -> None:
        """Ranks other than 0: run every step rank 0 announces, until it says stop."""
        while True:
            self.progress.begin()
            start = time.perf_counter()
            plan = self.channel.exchange()
            self.apply(plan, start)
            self.progress.end()
            if plan.stop:
                return


class Leader:
    """Rank 0: feeds requests to the scheduler, announces each step, publishes the text."""

    def __init__(
        self,
        loop: StepLoop,
        scheduler: Scheduler,
        inbox: Inbox,
        state: ServerState,
        *,
        stop_ids: tuple[int, ...],
        idle_tick_s: float = 0.5,
        drain_timeout_s: float = 20.0,
        on_step: Callable[[Leader], None] | None = None,
        on_token: Callable[[Submission, float, float | None], None] | None = None,
    ) -> None:
        self.loop, self.scheduler, self.inbox, self.state = loop, scheduler, inbox, state
        self.stop_ids, self.idle_tick_s = stop_ids, idle_tick_s
        self.drain_timeout_s = drain_timeout_s
        self.on_step, self.on_token = on_step, on_token
        #: every submission accepted and not answered yet: waiting, running or preempted
        self.requests: dict[int, Submission] = {}
        #: each sequence of those (a request of the core): its submission and choice
        self.choices: dict[int, tuple[Submission, int]] = {}
        self._last_token: dict[int, float] = {}
        #: a step's output, published once the next step's header has gone out
        self._pending: list[tuple[Submission, int, Emitted]] = []
        self._deadline: float | None = None
        self._seeds = random.SystemRandom()
        #: requests that failed alone (``Emitted.error``): cancelled on every rank at the next
        #: step (a no-op where the core dropped them already)
        self._dropped: list[int] = []

    @property
    def core(self) -> GenerationCore:
        return self.loop.core

    def run(self) -> None:
        """Steps until a drain (``state`` draining) has finished; raises on a failed rank.

        The text of a step is rendered and handed to HTTP after the next step's control
        header has gone out, so the other ranks start that step while rank 0 detokenizes:
        just before that step's first graph call (``GenerationCore.before_graph``), its
        inputs built, so that the HTTP thread writes it while the kernels run (they release
        the GIL) rather than while this thread builds inputs; after the step where it ran no
        graph."""
        self.core.defer_text = True
        self.core.before_graph = self._flush
        while True:
            if self._pending and self.scheduler.idle():
                self._flush()  # no step follows: tell them before waiting idle
            plan = self._plan()
            self.loop.progress.begin()  # the watchdog times the step from here
            start = time.perf_counter()
            plan = self.loop.channel.exchange(plan)
            out = self.loop.apply(plan, start)
            self._flush()  # the step ran no graph (cancels only): not handed over yet
            self._pending = self._collect(out)
            if self.on_step is not None:
                self.on_step(self)
            self.loop.progress.end()
            if plan.stop:
                self._flush()
                return

    def fail_all(self, status: int, message: str) -> None:
        """Answer every request queued, waiting or running (a rank failed). The last step's
        output is valid and is published first: a request it finished gets its whole answer,
        a running one its piece before the failure."""
        queued = [i for i in self.inbox.take(0.0) if isinstance(i, Submission)]
        self.inbox.left(sum(sub.n for sub in queued) + len(self.scheduler.waiting))
        self.scheduler.waiting.clear()
        failed = [*queued, *self.requests.values()]
        try:
            self._publish(self._pending)
        except Exception:  # the failure must still be told: those the step finished get it too
            logger.exception("publishing the last step's text failed")
            failed += [sub for sub, _, e in self._pending if e.finish is not None]
        once = {sub.rid: sub for sub in failed}.values()
        deliver([(sub.sink, Failed(status, message)) for sub in once])
        self.requests.clear()
        self.choices.clear()
        self._pending = []
        self._last_token.clear()

    def _plan(self) -> StepPlan:
        sched = self.scheduler
        dropped = set(self._dropped)  # failed alone: every rank lets it go (if it still runs)
        waiting = sum(r.rid in dropped for r in sched.waiting)  # counted in the wait queue
        for rid in self._dropped:
            sched.cancel(rid)
        self._dropped = []
        if waiting:
            self.inbox.left(waiting)
        group, sink = 0, None  # the prompts of one HTTP request: one group (sharing rows)
        for item in self.inbox.take(0.0 if not sched.idle() else self.idle_tick_s):
            if isinstance(item, Submission):
                group, sink = (group, sink) if item.sink is sink else (item.rid, item.sink)
                self._submit(item, group)
            elif isinstance(item, Cancel):
                self._cancel(item.rid)
        if self.state.state == "draining":
            return self._drain()
        plan = sched.plan()
        self.inbox.left(len(plan.joins))  # the wait queue counts sequences
        return plan

    def _submit(self, sub: Submission, group: int) -> None:
        seed = sub.seed if sub.seed is not None else self._seeds.randrange(2**31)
        reqs = [
            Request(
                rid,
                sub.prompt,
                sub.max_new_tokens,
                replace(sub.sampling, seed=(seed + j) % 2**64),  # vLLM's seed of choice j
                sub.sampling.end_ids(self.stop_ids),
                sub.stop,
                grammar=sub.grammar,
                follows=sub.rid if j else None,
                group=group,
            )
            for j, rid in enumerate(sub.rids)
        ]
        try:
            for req in reqs:  # every choice alike: all pass, or the first fails
                self.scheduler.core.check(req)
        except ConfigError as exc:  # the HTTP layer checks first; this is the last word
            self.inbox.left(sub.n)
            sub.sink.put(Failed(400, str(exc)))
            return
        for req in reqs:
            self.scheduler.add(req)
        self.requests[sub.rid] = sub
        self.choices.update((rid, (sub, j)) for j, rid in enumerate(sub.rids))

    def _forget(self, sub: Submission) -> None:
        """Stop tracking a submission: cancel its sequences that still run or wait (on every
        rank, at the next step)."""
        rids = set(sub.rids)
        waiting = sum(r.rid in rids for r in self.scheduler.waiting)
        for rid in sub.rids:
            if self.choices.pop(rid, None) is not None:
                self.scheduler.cancel(rid)
            self._last_token.pop(rid, None)
        if self.requests.pop(sub.rid, None) is not None and waiting:
            self.inbox.left(waiting)  # its sequences that had not joined

    def _cancel(self, rid: int) -> None:
        sub = self.requests.get(rid)
        if sub is not None:
            self._forget(sub)

    def _drain(self) -> StepPlan:
        """Refuse what waits; let the admitted requests finish until the deadline; then stop."""
        sched = self.scheduler
        waiting = {self.choices[r.rid][0].rid for r in sched.waiting if r.rid in self.choices}
        refused = [self.requests[rid] for rid in waiting]
        for sub in refused:
            self._forget(sub)
        deliver(
            [(s.sink, Failed(503, "the server is shutting down; retry elsewhere")) for s in refused]
        )
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.drain_timeout_s
        if self.core.sequences and now < self._deadline:
            return sched.plan()
        # the last step's text first, then the 503s: a client stops reading at its Failed
        timeout = Failed(503, "the server stopped (drain timeout) before this finished")
        self._publish(self._pending, then=[(sub.sink, timeout) for sub in self.requests.values()])
        self._pending = []
        for rid in list(self.core.sequences):
            sched.cancel(rid)
        plan = sched.plan()
        self.requests.clear()
        self.choices.clear()
        self._last_token.clear()
        plan.stop = True
        return plan

    def _collect(self, emitted: list[Emitted]) -> list[tuple[Submission, int, Emitted]]:
        """The part of ``emitted`` whose clients still listen; a finished sequence stops
        being tracked here (its blocks are free already), a submission with its last one."""
        out = []
        for e in emitted:
            found = self.choices.get(e.rid)
            if found is None:
                continue  # cancelled in this very step
            sub, j = found
            out.append((sub, j, e))
            if e.finish is not None and e.error is None:
                del self.choices[e.rid]
                if not any(rid in self.choices for rid in sub.rids):
                    del self.requests[sub.rid]
        return out

    def _flush(self) -> None:
        """Publish the last step's output, if not yet (kept until it is: a failure while
        publishing leaves it to ``fail_all``)."""
        if self._pending:
            self._publish(self._pending)
            self._pending = []

    def _publish(
        self, items: list[tuple[Submission, int, Emitted]], then: Sequence[tuple[Sink, Failed]] = ()
    ) -> None:
        """Render the text of ``items`` and hand it to HTTP, then ``then`` (one wake-up of its
        loop, in this order)."""
        if not items and not then:
            return
        self.core.render()
        now, made = time.perf_counter(), time.monotonic()  # made: compared in the HTTP process
        pieces: list[tuple[Sink, Piece | Failed]] = []
        failed: set[int] = set()
        for sub, j, e in items:
            if sub.rid in failed:
                continue  # another sequence of it failed: it has its answer
            if e.error is not None:  # this submission failed alone; the others go on
                fail = row_failure(
                    e.error, sampling=sub.sampling, stop=sub.stop, grammar=sub.grammar_param
                )
                pieces.append((sub.sink, fail))
                failed.add(sub.rid)
                self.inbox.finished(sub.rid)
                self._dropped += [rid for rid in sub.rids if rid in self.choices or rid == e.rid]
                for rid in sub.rids:
                    self.choices.pop(rid, None)
                    self._last_token.pop(rid, None)
                self.requests.pop(sub.rid, None)
                continue
            if self.on_token is not None and e.tokens:  # (request, now, previous token or None)
                self.on_token(sub, now, self._last_token.get(e.rid))
            if e.finish is None and e.rid in self.choices:
                self._last_token[e.rid] = now
            else:  # it finished, or it was cancelled after this step
                self._last_token.pop(e.rid, None)
            logprobs = (e.logprobs,) if e.logprobs is not None else ()
            piece = Piece(
                e.text, len(e.tokens), e.finish, e.cached, sub.index + j, logprobs, made=made
            )
            pieces.append((sub.sink, piece))
            if e.finish is not None and sub.rid not in self.requests:
                self.inbox.finished(sub.rid)  # answered: nothing left to fail (``fail_live``)
        deliver([*pieces, *then])
