"""The scheduler: which requests run in the next step, and what each computes (pure, rank 0).

    sched = Scheduler(core, max_rows=8, max_prefill_tokens=512)
    sched.add(request)                     # waits, first come first served
    plan = sched.plan()                    # a StepPlan: every rank's core applies it
    emitted = core.step(plan)

A step decodes every running sequence whose prompt is computed (one token each), then fills a
prefill budget with prompt chunks: first the prompts already being prefilled, oldest first,
then waiting requests, admitted in arrival order while a row, the budget and KV blocks allow
(the blocks a prompt shares with the prefix cache cost nothing). So a running stream waits at
most one budget's prefill, and a long prompt is prefilled over several steps.

The budget is the cost of ``max_prefill_tokens`` tokens at the start of a prompt. A token's
cost is its linear layers plus its attention over the positions before it
(:func:`chunk_cost`; ``attention_span``, from the model's shapes: the positions at which the
two are equal), so a later chunk of a long prompt is shorter than its first: each chunk of a
2,000-token prompt then stalls the running streams about as long as the first (on the bench
checkpoint, 512 tokens took 117 ms at the start and 240 ms after 1,536 tokens).
Another choice of a prompt (``Request.follows``: ``n`` > 1) is held back until the request it
follows has computed its prompt: it then takes the prompt's full blocks from the prefix cache
and computes only the last, partial block (requests behind it are not held with it).

With speculative decoding a decoding row asks the core for its proposal's length
(``GenerationCore.draft_size``) and gets the blocks for it where they leave a block for each
row after it; otherwise it decodes one token: a draft never preempts anyone.

When a step cannot get the blocks it needs (a sequence crosses into a new block and none is
free), the newest running sequence is preempted: its blocks are released (its full blocks stay
in the prefix cache) and it waits at the head of the queue, to be prefilled again from its
prompt and the tokens it has produced; its sampling state is kept, so it continues exactly.
Blocks are counted as the plan leaves the pool (``_Ledger``): the references its cancels and
preemptions drop and its prefix-cache hits take, so a block a victim frees and a resumed
sequence's hit takes back (equal choices share their blocks) is counted once. A sequence that
could never fit the whole pool is refused when added (``GenerationCore.check``).

The plan is a function of the core's state and the queue; only rank 0 has the queue, so rank 0
plans and every rank applies the plan (``serving/control.py`` carries it). ``generate`` runs
the same scheduler on every rank with the same requests: the plans agree without a message.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.kv_blocks import BlockPool, blocks_for, prefix_keys
from torch_tensorrt_dist.generation.plan import StepPlan

if TYPE_CHECKING:
    from torch_tensorrt_dist.generation.core import GenerationCore
    from torch_tensorrt_dist.generation.core import Sequence as CoreSequence
    from torch_tensorrt_dist.generation.plan import Request

__all__ = ["Scheduler", "StepPlan", "attention_span", "chunk_cost", "chunk_tokens", "group_of"]


def chunk_cost(n: int, past: int, span: float | None) -> float:
    """The cost of prefilling ``n`` prompt tokens after ``past`` computed ones, in tokens at the
    start of a prompt: each token's linear layers (1) and its attention over the positions
    before it and its own (``span`` positions cost 1; None: attention not counted)."""
    if span is None:
        return float(n)
    return n * (1.0 + (past + (n + 1) / 2) / span)


def chunk_tokens(budget: float, past: int, span: float | None) -> int:
    """The most tokens after ``past`` computed ones whose :func:`chunk_cost` fits ``budget``."""
    if budget <= 0:
        return 0
    if span is None:
        return int(budget + 1e-9)
    a, b = 1 / (2 * span), 1 + (past + 0.5) / span  # cost(n) = a n^2 + b n
    n = max(0, int((math.sqrt(b * b + 4 * a * budget) - b) / (2 * a)))
    while n > 0 and chunk_cost(n, past, span) > budget * (1 + 1e-12):
        n -= 1  # the root's rounding
    while chunk_cost(n + 1, past, span) <= budget * (1 + 1e-12):
        n += 1
    return n


def attention_span(dim: int, n_heads: int, n_kv_heads: int, head_dim: int, ffn: int) -> float:
    """The positions at which a token's attention (QK and PV over every head) costs what its
    linear layers do (q, k, v, o and a SwiGLU of ``ffn``; for a mixture of experts, the
    experts' size times those it runs): multiply-adds per layer, the same on every TP rank."""
    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    linear = dim * (q + 2 * kv) + q * dim + 3 * dim * ffn
    return linear / (2 * q)


def group_of(req: Request) -> int:
    """The request a sequence belongs to, for sharing rows: ``Request.group``, else the
    request it follows (another choice of one prompt), else its own id."""
    if req.group is not None:
        return req.group
    return req.follows if req.follows is not None else req.rid


@dataclass(eq=False)
class _Waiting:
    """A sequence waiting for a row: preempted (``req`` None) or new."""

    rid: int
    tokens: Sequence[int]
    req: Request | None
    group: int


class _Ledger:
    """The pool as a plan leaves it: blocks available, with the references the plan drops
    (cancels, preemptions) and takes (prefix-cache hits) counted, so that a block a victim
    frees and an admission's hit takes back is counted once (counting it free and the hit
    free too ran a step out of blocks: ``NoBlocks`` on every rank)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool, self.avail = pool, pool.available
        self._delta: Counter[int] = Counter()

    def _refs(self, block: int) -> int:
        return self.pool.references(block) + self._delta[block]

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            self._delta[block] -= 1
            self.avail += self._refs(block) == 0  # free, or cached: allocatable either way

    def hit_cost(self, keys: list[bytes]) -> int:
        """Blocks a prefix-cache hit on ``keys`` takes out of the available ones."""
        return sum(self._refs(b) == 0 for b in self.pool.cached_blocks(keys))

    def take(self, keys: list[bytes], fresh: int) -> None:
        """A hit on ``keys`` and ``fresh`` new blocks."""
        for block in self.pool.cached_blocks(keys):
            self.avail -= self._refs(block) == 0
            self._delta[block] += 1
        self.avail -= fresh


class Scheduler:
    """Rank 0's queue and planner over a :class:`GenerationCore` (see the module docstring)."""

    def __init__(
        self,
        core: GenerationCore,
        *,
        max_rows: int,
        max_prefill_tokens: int,
        attention_span: float | None = None,
    ) -> None:
        if max_rows < 1:
            raise ConfigError(f"max_rows must be >= 1, got {max_rows}")
        if max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {max_prefill_tokens}")
        if attention_span is not None and not attention_span > 0:
            raise ConfigError(f"attention_span must be > 0, got {attention_span}")
        self.core, self.max_rows = core, max_rows
        self.max_prefill_tokens, self.span = max_prefill_tokens, attention_span
        #: a step's prefill cost: ``max_prefill_tokens`` at the start of a prompt
        self.budget = chunk_cost(max_prefill_tokens, 0, attention_span)
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
        ledger = _Ledger(core.pool)
        for rid in gone:
            ledger.release(core.sequences[rid].blocks)
        running = [s for s in core.running if s.rid not in gone]
        queue = [
            _Waiting(s.rid, s.tokens, None, group_of(s.req))
            for s in core.preempted.values()
            if s.rid not in gone
        ]
        queue += [_Waiting(r.rid, r.prompt, r, group_of(r)) for r in self.waiting]
        held = Counter(group_of(s.req) for s in running)
        waiting_rids = {r.rid for r in self.waiting}
        self._share_rows(plan, running, queue, held, waiting_rids, ledger)

        # 1. every running sequence gets the blocks for this step's tokens, oldest first; when
        #    blocks run out, the newest running sequence is preempted (maybe the one asking)
        budget, scheduled = self.budget, []
        i = 0
        while i < len(running):
            seq = running[i]
            n = 1 if seq.decoding else min(self._fit(budget, seq.computed), seq.to_compute)
            if n == 0:  # a prompt being prefilled, no budget left this step
                i += 1
                continue
            need = blocks_for(seq.computed + n, bs) - len(seq.blocks)
            k = core.draft_size(seq) if core.speculative is not None else 0
            if k:  # a draft's blocks, where they leave a block for each row after this one
                more = blocks_for(seq.computed + n + k, bs) - len(seq.blocks)
                if more + len(running) - i - 1 <= ledger.avail:
                    need = more
                    plan.drafts.append((seq.rid, k))
            while need > ledger.avail:  # never with a draft (it fits, with room)
                victim = running.pop()
                plan.preempts.append(victim.rid)
                self.preemptions += 1
                ledger.release(victim.blocks)
                held[group_of(victim.req)] -= 1
                if victim is seq:
                    break
            else:
                ledger.take([], need)
                scheduled.append((seq, n))
                if not seq.decoding:
                    budget -= chunk_cost(n, seq.computed, self.span)
                i += 1
        plan.chunks = [(seq.rid, n) for seq, n in scheduled if not seq.decoding]

        # 2. admit waiting sequences: of the request holding the fewest rows first, then
        #    preempted ones first, then in arrival order
        rows = len(running)
        joined: set[int] = set()
        while rows < self.max_rows and budget > 0:
            pick = self._next(queue, held, waiting_rids, joined)
            if pick is None:
                break
            keys, n, fresh = self._first_chunk(pick.tokens, budget)
            hit = len(keys)
            if n == 0 or fresh + ledger.hit_cost(keys) > ledger.avail:
                break
            queue.remove(pick)
            if pick.req is None:
                plan.resumes.append(pick.rid)
            else:
                self.waiting.remove(pick.req)
                waiting_rids.discard(pick.rid)
                plan.joins.append(pick.req)
                joined.add(pick.rid)
            if hit:
                plan.cached[pick.rid] = hit
            plan.chunks.append((pick.rid, n))
            rows += 1
            held[pick.group] += 1
            ledger.take(keys, fresh)
            budget -= chunk_cost(n, hit * self.core.block_size, self.span)
        return plan

    def _next(
        self, queue: list[_Waiting], held: Counter[int], waiting: set[int], joined: set[int]
    ) -> _Waiting | None:
        """The waiting sequence to admit next: the first of those whose request holds the
        fewest rows (a sequence whose prompt another computes first is passed over)."""
        best: _Waiting | None = None
        for w in queue:
            if best is not None and held[w.group] >= held[best.group]:
                continue
            if self._held_back(w, joined, waiting):
                continue  # its prompt's blocks are not in the prefix cache yet
            best = w
            if held[w.group] == 0:
                break
        return best

    def _share_rows(
        self,
        plan: StepPlan,
        running: list[CoreSequence],
        queue: list[_Waiting],
        held: Counter[int],
        waiting: set[int],
        ledger: _Ledger,
    ) -> None:
        """With every row taken, a request that holds none and could start gets a row of the
        request holding the most (its newest sequence is preempted; it resumes from the
        prefix cache), one row per such request: so one request of many sequences cannot
        hold every row while others wait. A request of one sequence is never preempted so."""
        free = self.max_rows - len(running)
        if free >= len(queue) or max(held.values(), default=0) < 2:
            return  # a row for each, or nobody to take one from
        starving: dict[int, None] = {}
        for w in queue:
            if held[w.group] or w.group in starving:
                continue
            if not self._held_back(w, set(), waiting):
                starving[w.group] = None
        for _ in list(starving)[max(free, 0) :]:
            big, most = max(held.items(), key=lambda kv: kv[1], default=(None, 0))
            if big is None or most < 2:
                return
            victim = next(s for s in reversed(running) if group_of(s.req) == big)
            running.remove(victim)
            plan.preempts.append(victim.rid)
            self.preemptions += 1
            ledger.release(victim.blocks)
            held[big] -= 1

    def _fit(self, budget: float, past: int) -> int:
        """A chunk's tokens after ``past`` computed ones within ``budget`` (at most
        ``max_prefill_tokens``, the graphs' limit); a step's whole budget always buys one
        token, so every prompt advances however long its past."""
        n = min(chunk_tokens(budget, past, self.span), self.max_prefill_tokens)
        return max(n, 1) if budget >= self.budget else n

    def _held_back(self, w: _Waiting, joined: set[int], waiting: set[int]) -> bool:
        """Whether ``w`` is another choice of a prompt not computed yet."""
        return (
            w.req is not None
            and w.req.follows is not None
            and self._prompt_pending(w.req, joined, waiting)
        )

    def _prompt_pending(self, req: Request, joined: set[int], waiting: set[int]) -> bool:
        """Whether the request ``req`` follows has not computed its prompt yet (waiting,
        joining in this plan, or prefilling); once it has, or has gone, ``req`` may join."""
        if not self.core.pool.prefix_caching:
            return False  # nothing to share: no reason to wait
        rid = req.follows
        if rid in joined or rid in waiting:
            return True
        seq = self.core.sequences.get(rid)  # type: ignore[arg-type]
        return seq is not None and not seq.out

    def _first_chunk(self, tokens: Sequence[int], budget: float) -> tuple[list[bytes], int, int]:
        """(keys of the cached prefix, tokens of the first chunk, new blocks it allocates)
        of admitting ``tokens`` now. The last token is always computed (its logits pick the
        next token), so it is never part of the cached prefix."""
        pool, bs = self.core.pool, self.core.block_size
        usable = (len(tokens) - 1) // bs * bs
        keys = prefix_keys(tokens[:usable], bs, salt=self.core.salt)
        hit = pool.cached_prefix(keys)
        n = min(self._fit(budget, hit * bs), len(tokens) - hit * bs)
        return keys[:hit], n, blocks_for(hit * bs + n, bs) - hit
