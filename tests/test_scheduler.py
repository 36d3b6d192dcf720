"""The scheduler's plans (pure: a core over a stand-in step that returns fixed logits): the
prefill budget, first come first served, the row limit, preemption of the newest request,
cancels in every state, and steady steps that need no message to the other ranks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.core import GenerationCore, Request
from torch_tensorrt_dist.generation.kv_blocks import BlockPool
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.generation.scheduler import (
    Scheduler,
    attention_span,
    chunk_cost,
    chunk_tokens,
)
from torch_tensorrt_dist.generation.step_inputs import StepLimits, past_split, warmup_prompts

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


def test_chunk_cost_counts_each_tokens_attention_over_what_comes_before_it() -> None:
    # 4 tokens after 10: linear 4, attention over 11 + 12 + 13 + 14 = 50 positions at 1/25 each
    assert chunk_cost(4, 10, 25.0) == pytest.approx(4 + 50 / 25)
    assert chunk_cost(4, 10, None) == 4.0  # attention not counted: tokens
    # the most tokens within a budget: the cost's inverse, exact at the boundary
    for past in (0, 7, 100, 10_000):
        for budget in (0.5, 1.0, 6.0, 37.3, 500.0):
            n = chunk_tokens(budget, past, 25.0)
            assert chunk_cost(n, past, 25.0) <= budget < chunk_cost(n + 1, past, 25.0)
    assert chunk_tokens(chunk_cost(9, 30, 25.0), 30, 25.0) == 9
    assert chunk_tokens(7.9, 5, None) == 7 and chunk_tokens(0.0, 0, 25.0) == 0
    # hidden 256, 8 heads of 32 (4 KV heads), SwiGLU 768: per layer 256 x (256 + 2 x 128) for
    # q, k, v, 256 x 256 for o, 3 x 256 x 768 for the MLP; attention 2 x 256 per position
    linear = 256 * 512 + 256 * 256 + 3 * 256 * 768
    assert attention_span(256, 8, 4, 32, 768) == linear / 512 == 1536.0


def test_with_attention_counted_later_chunks_are_shorter_and_fill_the_budget() -> None:
    """A 40-token prompt after 3 decoding streams, 8 tokens at the start of a prompt per step,
    a token's attention over 16 positions costing what its linear layers do: the chunks
    shrink as the prompt's past grows, each as long as the budget allows, and the streams decode
    at every step."""
    core = _core()
    sched = Scheduler(core, max_rows=8, max_prefill_tokens=8, attention_span=16.0)
    assert sched.budget == chunk_cost(8, 0, 16.0)
    for rid in range(3):
        sched.add(Request(rid, (1, 2), 60))
    _run(sched, 2)
    sched.add(Request(9, tuple(range(40)), 5))
    sizes: list[int] = []
    while sum(sizes) < 40:
        plan = sched.plan()
        ((rid, n),) = plan.chunks
        past = sum(sizes)
        assert rid == 9 and chunk_cost(n, past, 16.0) <= sched.budget
        # as long as the budget allows: one token more would not fit (unless the prompt ended)
        assert past + n == 40 or chunk_cost(n + 1, past, 16.0) > sched.budget
        sizes.append(n)
        assert {0, 1, 2} <= {e.rid for e in core.step(plan)}
    assert sizes[0] == 8 and sizes == sorted(sizes, reverse=True) and len(sizes) > 5
    assert sizes[:4] == [8, 5, 5, 4]  # pasts 0, 8, 13, 18 (budget 10.25; 5 after 13: 10)
    with pytest.raises(ConfigError, match="attention_span must be > 0"):
        Scheduler(core, max_rows=8, max_prefill_tokens=8, attention_span=0.0)


def test_the_models_span_counts_what_a_token_runs() -> None:
    from torch_tensorrt_dist.generation.generate import model_attention_span
    from torch_tensorrt_dist.models.llama import Transformer
    from torch_tensorrt_dist.models.llama_args import ModelArgs
    from torch_tensorrt_dist.models.moe import MoETransformer
    from torch_tensorrt_dist.models.moe_args import MoEArgs

    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=32, intermediate_size=96
    )
    moe = MoEArgs(n_experts=4, top_k=2, expert_size=40, shared_expert_size=24)
    with torch.device("meta"):
        dense, sparse = Transformer(args), MoETransformer(args, moe)
    assert model_attention_span(args) == attention_span(64, 4, 2, 16, 96)
    # the experts a token runs (2 of 40) and the shared expert, not all 4
    assert model_attention_span(args, moe) == attention_span(64, 4, 2, 16, 2 * 40 + 24)
    assert (dense.args, sparse.moe) == (args, moe)  # what a Generator reads from its model


def test_a_prompt_far_past_its_budget_still_advances_a_token_a_step() -> None:
    core = _core(max_len=128)
    # a span so short that one token after 50 costs more than the whole budget (2 at the start)
    sched = Scheduler(core, max_rows=2, max_prefill_tokens=2, attention_span=0.5)
    assert chunk_cost(1, 50, 0.5) > sched.budget
    sched.add(Request(0, tuple(range(60)), 2))
    steps = 0
    while not any(e.rid == 0 for e in core.step(sched.plan())):
        steps += 1
        assert steps < 80
    assert steps >= 30  # one token per step once the past is long


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


@pytest.mark.parametrize(("rows", "temperature"), [(8, 0.0), (3, 1.0)])
def test_n_choices_beside_single_requests_in_16_blocks_all_finish(
    rows: int, temperature: float
) -> None:
    """The reproduction of a server that ran out of blocks mid-step: one request of n = 8
    (choices after the first follow it, sharing its prompt's blocks) beside four single
    requests, 250 tokens each, in a KV cache of 16 blocks of 16 tokens (one sequence at a
    time, by preemption). Greedy choices are equal, so they share their committed blocks: a
    victim's blocks that a resumed choice's prefix hit took back were counted free twice
    (``NoBlocks`` on every rank; the server exited)."""
    core = _core(blocks=17, block_size=16, max_len=512)
    sched = Scheduler(core, max_rows=rows, max_prefill_tokens=64)
    hot = SamplingConfig(temperature=temperature)
    for j in range(8):  # choice j samples with seed j: their texts (and blocks) differ
        cfg = replace(hot, seed=j)
        sched.add(Request(100 + j, (1, 2, 3, 4, 5), 250, cfg, follows=None if j == 0 else 100))
    for k in range(4):
        sched.add(Request(k, tuple(range(10 + k, 16 + k)), 250, replace(hot, seed=50 + k)))
    made: dict[int, list[int]] = {}
    for _ in range(5_000):
        if sched.idle():
            break
        for e in core.step(sched.plan()):
            made.setdefault(e.rid, []).extend(e.tokens)
    assert sched.idle() and sched.preemptions > 0
    assert {rid: len(t) for rid, t in made.items()} == {
        rid: 250 for rid in [*range(100, 108), *range(4)]
    }
    assert len({tuple(made[100 + j]) for j in range(8)}) == (8 if temperature else 1)
    assert core.pool.stats().used == 0


def test_a_sequence_larger_than_the_whole_cache_is_refused_when_added() -> None:
    sched = Scheduler(
        _core(blocks=17, block_size=16, max_len=512), max_rows=2, max_prefill_tokens=64
    )
    sched.add(Request(0, (1, 2, 3, 4, 5), 252))  # 256 tokens computed at most: 16 blocks
    with pytest.raises(
        ConfigError,
        match=r"needs 17 KV blocks of 16 tokens, and the KV cache "
        r"holds 16 \(256 tokens; --kv-cache-memory\): use max_new_tokens <= 252",
    ):
        sched.add(Request(1, (1, 2, 3, 4, 5), 253))


def test_a_request_of_many_sequences_cannot_hold_every_row_while_another_waits() -> None:
    """8 prompts x n = 4 as one client's request (32 sequences of 30 tokens) on 4 rows: alone,
    it takes every row and nothing is preempted; a plain request arriving later gets a row
    at its first step (one of the big request's sequences is preempted and resumes from the
    prefix cache); every sequence still ends with its full length."""
    core = _core(blocks=256, block_size=4, max_len=128)
    sched = Scheduler(core, max_rows=4, max_prefill_tokens=64)
    for p in range(8):
        prompt = tuple(range(p, p + 6))
        for j in range(4):
            leader = 100 + 4 * p
            follows = None if j == 0 else leader
            sched.add(Request(leader + j, prompt, 30, follows=follows, group=100))
    made: dict[int, int] = {}

    def step() -> object:
        plan = sched.plan()
        for e in core.step(plan):
            made[e.rid] = made.get(e.rid, 0) + len(e.tokens)
        return plan

    for _ in range(10):
        step()
    assert len(core.running) == 4 and sched.preemptions == 0  # alone: every row, no preemption
    sched.add(Request(7, (9, 9, 9), 30))
    plan = step()
    assert [r.rid for r in plan.joins] == [7] and len(plan.preempts) == 1  # type: ignore[attr-defined]
    for _ in range(2_000):
        if sched.idle():
            break
        step()
    assert made == {rid: 30 for rid in [7, *range(100, 132)]}
    assert sched.preemptions == 1  # the plain request held one row: no further preemption


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


def _graph(rows: int, tokens: int, split: int) -> tuple[bool, bool, bool]:
    """Which compiled graph a call of ``rows`` x ``tokens`` takes: one row or several (Dynamo
    specialises 1), decode or prefill (1 token or more), and the side of ``split`` token rows
    (``cpu_gemm="reduce"``: ``compile_paged_step``)."""
    return rows == 1, tokens == 1, rows * tokens <= split


@pytest.mark.parametrize("split", [2, 12, 16])
def test_the_warmup_prompts_reach_every_graph_a_step_can_take(split: int) -> None:
    """Every (rows, tokens) a step of at most ``max_rows`` rows and ``longest`` tokens can run
    falls in a graph that the warm-up's prompts (their prefill, then their decode) ran."""
    for max_rows in range(1, 35):
        for longest in range(2, 41):
            warm = warmup_prompts(max_rows, longest, split)
            assert all(len(p) <= max_rows and len(p[0]) <= longest for p in warm)
            ran = {_graph(len(p), len(p[0]), split) for p in warm}
            ran |= {_graph(len(p), 1, split) for p in warm}
            can = {
                _graph(r, t, split) for r in range(1, max_rows + 1) for t in range(1, longest + 1)
            }
            assert can <= ran, (max_rows, longest, can - ran)


def test_past_split_calls_reach_past_it_where_a_step_can() -> None:
    assert past_split(1, 17, 16) == [(1, 17)]  # one row alone past it
    assert past_split(1, 16, 16) == []  # nothing a step can run is past it
    assert past_split(2, 9, 16) == [(2, 9)]
    assert past_split(2, 8, 16) == []  # 2 x 8 = 16: not past
    assert past_split(3, 6, 16) == [(3, 6)]
    assert past_split(8, 512, 16) == [(1, 512), (2, 512)]
    for rows in range(1, 20):
        for tokens in range(2, 40):
            calls = past_split(rows, tokens, 16)
            assert all(r <= rows and s <= tokens and r * s > 16 for r, s in calls)
            assert (rows * tokens > 16) == any(r >= 2 for r, _ in calls) or rows == 1
            assert (tokens > 16) == any(r == 1 for r, _ in calls)
