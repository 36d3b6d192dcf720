"""The scheduler's plans (pure: a core over a stand-in step that returns fixed logits): the
prefill budget, first come first served, the row limit, preemption of the newest request,
cancels in every state, and steady steps that need no message to the other ranks."""

from __future__ import annotations

import torch
from torch import Tensor

from torch_tensorrt_dist.generation.core import GenerationCore, Request
from torch_tensorrt_dist.generation.kv_blocks import BlockPool
from torch_tensorrt_dist.generation.scheduler import Scheduler
from torch_tensorrt_dist.generation.step_inputs import StepLimits

VOCAB = 16


def _step(tokens: Tensor, start: Tensor, last: Tensor, past: Tensor, dest: Tensor) -> Tensor:
    """Logits whose argmax is (position of the row's last token + 1) % VOCAB."""
    nxt = (start + last + 1) % VOCAB
    return torch.nn.functional.one_hot(nxt, VOCAB).float()


def _core(blocks: int = 64, block_size: int = 4, max_len: int = 128) -> GenerationCore:
    pool = BlockPool(blocks, block_size)
    limits = StepLimits(rows=16, tokens=128, blocks=max_len // block_size, block_size=block_size)
    return GenerationCore(_step, pool=pool, max_seq_len=max_len, limits=limits)


def _run(sched: Scheduler, steps: int) -> list[dict[str, object]]:
    log = []
    for _ in range(steps):
        plan = sched.plan()
        running = [s.rid for s in sched.core.running]
        emitted = sched.core.step(plan)
        log.append({"plan": plan, "running": running, "emitted": {e.rid for e in emitted}})
    return log


def test_a_long_prompt_is_chunked_and_running_streams_decode_every_step() -> None:
    core = _core()
    sched = Scheduler(core, max_rows=8, max_prefill_tokens=8)
    for rid in range(3):
        sched.add(Request(rid, (1, 2), 50))
    _run(sched, 2)  # the three are decoding
    sched.add(Request(9, tuple(range(40)), 5))
    for step in range(5):
        plan = sched.plan()
        assert plan.chunks == [(9, 8)] and not plan.steady  # 8 prompt tokens per step
        emitted = {e.rid for e in core.step(plan)}
        assert {0, 1, 2} <= emitted  # no running stream waits for the prompt
        assert (9 in emitted) == (step == 4)  # its first token after the fifth chunk
    plan = sched.plan()
    assert plan.steady and not plan.chunks  # decode only: header, no payload


def test_admission_is_first_come_first_served_within_rows_and_budget() -> None:
    core = _core()
    sched = Scheduler(core, max_rows=2, max_prefill_tokens=10)
    for rid, n in enumerate((6, 6, 2)):
        sched.add(Request(rid, tuple(range(n)), 3))
    plan = sched.plan()
    # 0 fits whole, 1 gets the 4 tokens left; 2 waits for a row although it is short
    assert [r.rid for r in plan.joins] == [0, 1] and plan.chunks == [(0, 6), (1, 4)]
    core.step(plan)
    plan = sched.plan()
    assert plan.chunks == [(1, 2)] and not plan.joins  # rows are full
    core.step(plan)
    while 2 not in [r.rid for r in plan.joins]:
        plan = sched.plan()
        core.step(plan)
    assert len(core.running) <= 2


def test_running_out_of_blocks_preempts_the_newest_and_it_resumes_first() -> None:
    core = _core(blocks=9, block_size=4)  # 8 usable blocks
    sched = Scheduler(core, max_rows=4, max_prefill_tokens=64)
    sched.add(Request(0, (1, 2, 3), 20))  # grows to 23 tokens: 6 blocks
    sched.add(Request(1, (4, 5, 6), 20))
    sched.add(Request(2, (7,), 2))  # waits for blocks after 1 is preempted
    log = _run(sched, 40)
    preempted = [r for entry in log for r in entry["plan"].preempts]  # type: ignore[union-attr]
    assert preempted and set(preempted) == {1}
    resumed = [r for entry in log for r in entry["plan"].resumes]  # type: ignore[union-attr]
    assert resumed == [1] * len(preempted)
    assert sched.idle() and core.pool.stats().used == 0


def test_cancels_of_waiting_running_and_preempted_requests() -> None:
    core = _core(blocks=9, block_size=4)
    sched = Scheduler(core, max_rows=2, max_prefill_tokens=64)
    for rid in range(3):
        sched.add(Request(rid, (1, 2, 3), 25))
    assert sched.cancel(2)  # waiting: dropped at once
    for _ in range(30):  # two rows of up to 7 blocks in 8: one is preempted
        core.step(sched.plan())
        if core.preempted:
            break
    victim = next(iter(core.preempted))
    assert sched.cancel(victim) and sched.cancel(0)
    emitted = core.step(sched.plan())
    assert {e.rid for e in emitted if e.finish == "cancelled"} == {0, victim}
    assert not sched.cancel(0)  # finished: unknown
    assert sched.idle() and core.pool.stats().used == 0


def test_the_same_requests_give_the_same_plans() -> None:
    """What lets ``generate`` run without messages: two schedulers, the same plans."""

    def plans() -> list[str]:
        core = _core(blocks=12)
        sched = Scheduler(core, max_rows=3, max_prefill_tokens=6)
        for rid in range(5):
            sched.add(Request(rid, tuple(range(rid * 3 + 1)), 9))
        return [repr(e["plan"]) for e in _run(sched, 30)]

    assert plans() == plans()
