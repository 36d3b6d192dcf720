"""The scheduler: which requests run in the next step, and what each computes (pure, rank 0).

    sched = Scheduler(core, max_rows=8, max_prefill_tokens=512)
    sched.add(request)                     # waits, first come first served
    plan = sched.plan()                    # a StepPlan: every rank's core applies it
    emitted = core.step(plan)

A step decodes every running sequence whose prompt is computed (one token each), then fills a
token budget (``max_prefill_tokens``) with prefill chunks: first the prompts already being
prefilled, oldest first, then waiting requests, admitted in arrival order while a row, the
budget and KV blocks allow (the blocks a prompt shares with the prefix cache cost nothing).
So a running stream waits at most one chunk, and a long prompt is prefilled over several steps.
Another choice of a prompt (``Request.follows``: ``n`` > 1) is held back until the request it
follows has computed its prompt: it then takes the prompt's full blocks from the prefix cache
and computes only the last, partial block (requests behind it are not held with it).

When a step cannot get the blocks it needs (a sequence crosses into a new block and none is
free), the newest running sequence is preempted: its blocks are released (its full blocks stay
in the prefix cache) and it waits at the head of the queue, to be prefilled again from its
prompt and the tokens it has produced; its sampling state is kept, so it continues exactly.

The plan is a function of the core's state and the queue; only rank 0 has the queue, so rank 0
plans and every rank applies the plan (``serving/control.py`` carries it). ``generate`` runs
the same scheduler on every rank with the same requests: the plans agree without a message.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.kv_blocks import blocks_for, prefix_keys
from torch_tensorrt_dist.generation.plan import StepPlan

if TYPE_CHECKING:
    from torch_tensorrt_dist.generation.core import GenerationCore
    from torch_tensorrt_dist.generation.plan import Request

__all__ = ["Scheduler", "StepPlan"]


class Scheduler:
    """Rank 0's queue and planner over a :class:`GenerationCore` (see the module docstring)."""

    def __init__(self, core: GenerationCore, *, max_rows: int, max_prefill_tokens: int) -> None:
        if max_rows < 1:
            raise ConfigError(f"max_rows must be >= 1, got {max_rows}")
        if max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {max_prefill_tokens}")
        self.core, self.max_rows, self.budget = core, max_rows, max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self._cancels: list[int] = []
        self.preemptions = 0

    @property
    def pending(self) -> int:
        """Requests waiting to be admitted (new or preempted)."""
        return len(self.waiting) + len(self.core.preempted)

    def add(self, req: Request) -> None:
        self.core.check(req)
        self.waiting.append(req)

    def cancel(self, rid: int) -> bool:
        """Drop a waiting request now, or cancel a running or preempted one at the next step;
        False when the request is unknown (finished already)."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                return True
        if rid in self.core.sequences:
            self._cancels.append(rid)
            return True
        return False

    def idle(self) -> bool:
        return not (self.waiting or self.core.sequences or self._cancels)

    def plan(self) -> StepPlan:
        core, bs = self.core, self.core.block_size
        plan = StepPlan(cancels=self._cancels)
        self._cancels = []
        gone = set(plan.cancels)
        avail = core.pool.available + sum(
            core.pool.exclusive(core.sequences[rid].blocks) for rid in gone
        )
        running = [s for s in core.running if s.rid not in gone]

        # 1. every running sequence gets the blocks for this step's tokens, oldest first; when
        #    blocks run out, the newest running sequence is preempted (maybe the one asking)
        budget, scheduled = self.budget, []
        i = 0
        while i < len(running):
            seq = running[i]
            n = 1 if seq.decoding else min(budget, seq.to_compute)
            if n == 0:  # a prompt being prefilled, no budget left this step
                i += 1
                continue
            need = blocks_for(seq.computed + n, bs) - len(seq.blocks)
            while need > avail:
                victim = running.pop()
                plan.preempts.append(victim.rid)
                self.preemptions += 1
                avail += core.pool.exclusive(victim.blocks)
                if victim is seq:
                    break
            else:
                avail -= need
                scheduled.append((seq, n))
                if not seq.decoding:
                    budget -= n
                i += 1
        plan.chunks = [(seq.rid, n) for seq, n in scheduled if not seq.decoding]

        # 2. admit waiting requests: preempted ones first (in their order), then new ones
        rows = len(running)
        queue: list[tuple[int, list[int], Request | None]] = [
            (s.rid, s.tokens, None) for s in core.preempted.values() if s.rid not in gone
        ]
        queue += [(r.rid, list(r.prompt), r) for r in self.waiting]
        joined: set[int] = set()
        for rid, tokens, req in queue:
            if rows >= self.max_rows or budget < 1:
                break
            if req is not None and req.follows is not None and self._prompt_pending(req, joined):
                continue  # its prompt's blocks are not in the prefix cache yet
            hit, n, cost = self._first_chunk(tokens, budget)
            if cost > avail:
                break
            if req is None:
                plan.resumes.append(rid)
            else:
                self.waiting.remove(req)
                plan.joins.append(req)
                joined.add(rid)
            if hit:
                plan.cached[rid] = hit
            plan.chunks.append((rid, n))
            rows, budget, avail = rows + 1, budget - n, avail - cost
        return plan

    def _prompt_pending(self, req: Request, joined: set[int]) -> bool:
        """Whether the request ``req`` follows has not computed its prompt yet (waiting,
        joining in this plan, or prefilling); once it has, or has gone, ``req`` may join."""
        if not self.core.pool.prefix_caching:
            return False  # nothing to share: no reason to wait
        rid = req.follows
        if rid in joined or any(r.rid == rid for r in self.waiting):
            return True
        seq = self.core.sequences.get(rid)  # type: ignore[arg-type]
        return seq is not None and not seq.out

    def _first_chunk(self, tokens: list[int], budget: int) -> tuple[int, int, int]:
        """(cached prefix blocks, tokens of the first chunk, blocks it takes from the pool)
        of admitting ``tokens`` now. The last token is always computed (its logits pick the
        next token), so it is never part of the cached prefix."""
        pool, bs = self.core.pool, self.core.block_size
        usable = (len(tokens) - 1) // bs * bs
        keys = prefix_keys(tokens[:usable], bs, salt=self.core.salt)
        hit = pool.cached_prefix(keys)
        n = min(budget, len(tokens) - hit * bs)
        cost = blocks_for(hit * bs + n, bs) - hit + pool.reclaimable(keys[:hit])
        return hit, n, cost
