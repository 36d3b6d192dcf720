"""A scripted serving schedule over the generation core (requests arrive and leave at given
steps), run in one process and in spawned gloo ranks by ``test_core.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.generation.core import Request
from torch_tensorrt_dist.generation.grammar import GrammarSpec
from torch_tensorrt_dist.generation.sampling import SamplingConfig

ROWS = 3
CACHE_LEN = 64
#: small blocks and a small prefill budget: prompts are chunked, rows cross blocks often
CORE = {"block_size": 4, "max_prefill_tokens": 8}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One torch thread while references run in the test process (on a busy 2-core machine
    two threads spin-wait: 20x slower), as the launched ranks run."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@dataclass
class Job:
    """One request of the schedule: arrives at ``step`` (admitted when the scheduler can)."""

    step: int
    prompt: list[int]
    max_new: int
    cancel_at: int | None = None  # a step at which the client goes away
    sampling: dict[str, Any] = field(default_factory=dict)
    grammar: dict[str, Any] | None = None  # a GrammarSpec's JSON (structured output)
    follows: int | None = None  # another choice of that job's prompt (n > 1)

    def request(self, rid: int, stop_ids: tuple[int, ...]) -> Request:
        cfg = SamplingConfig(**self.sampling)
        grammar = None if self.grammar is None else GrammarSpec.from_json(self.grammar)
        ends = cfg.end_ids(stop_ids)  # what the leader of a server does
        return Request(
            rid, tuple(self.prompt), self.max_new, cfg, ends, grammar=grammar, follows=self.follows
        )


def run_schedule(
    gen: Generator, jobs: list[Job], stop_ids: tuple[int, ...], grammars: Any = None
) -> dict[str, Any]:
    """Run ``jobs`` through ``gen``'s scheduler and core as a server would: tokens per job,
    steps taken, preemptions, prefix-cache hits per job and the most requests running at once
    (``grammars``: the grammar engine of jobs with a grammar; also each job's logprobs, finish
    and the step it joined)."""
    core = gen.core()
    core.grammars = grammars
    sched = gen.scheduler(core)
    out: dict[int, list[int]] = {i: [] for i in range(len(jobs))}
    logprobs: dict[int, list[Any]] = {i: [] for i in range(len(jobs))}
    finish: dict[int, str | None] = {}
    joined: dict[int, int] = {}
    cached: dict[int, int] = {}
    step, most = 0, 0
    while step <= max(j.step for j in jobs) or not sched.idle():
        for rid, job in enumerate(jobs):
            if job.cancel_at == step:
                sched.cancel(rid)
            if job.step == step:
                sched.add(job.request(rid, stop_ids))
        plan = sched.plan()
        joined.update((r.rid, step) for r in plan.joins)
        for e in core.step(plan):
            out[e.rid] += e.tokens
            if e.logprobs is not None:
                logprobs[e.rid].append(e.logprobs)
            if e.finish is not None:
                finish[e.rid] = e.finish
            if e.cached:
                cached[e.rid] = e.cached
        most = max(most, core.active)
        step += 1
        if step > 2000:
            raise RuntimeError("the schedule did not finish")
    return {
        "tokens": [out[i] for i in range(len(jobs))],
        "steps": step,
        "preemptions": sched.preemptions,
        "cached": cached,
        "most_running": most,
        "pool": core.pool.stats(),
        "logprobs": [logprobs[i] for i in range(len(jobs))],
        "finish": [finish.get(i) for i in range(len(jobs))],
        "joined": [joined.get(i) for i in range(len(jobs))],
        "speculated": (core.spec_proposed, core.spec_accepted),
    }


def make_generator(model: Any, kv_blocks: int | None = None, **kw: Any) -> Generator:
    """The schedule's generator (``CORE`` blocks and budget); ``kv_blocks``: a pool of that
    many blocks (few: requests are preempted)."""
    from torch_tensorrt_dist.generation.kv_memory import kv_layout

    memory = None
    if kv_blocks is not None:
        memory = kv_blocks * kv_layout(model, CORE["block_size"]).bytes_per_block
    opts = {"max_batch_size": ROWS, "cache_len": CACHE_LEN, **CORE, **kw}
    return Generator(model, kv_cache_memory=memory, **opts)


def alone(gen: Generator, job: Job, stop_ids: tuple[int, ...]) -> list[int]:
    """The job's prompt alone through ``generate`` (cut where the schedule cancels it)."""
    res = gen.generate(
        [job.prompt],
        max_new_tokens=job.max_new,
        sampling=SamplingConfig(**job.sampling),
        stop_ids=stop_ids,
    )
    return res.tokens[0]


def rank_schedules(rank: int, world: int, spec: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """On each gloo rank: load each checkpoint sharded over the world, run its schedule."""
    import torch.distributed as dist

    from torch_tensorrt_dist.parallel.llama_load import load_llama

    results = []
    for case in spec:
        if case.get("ep"):  # a MoE checkpoint on an (ep, tp) mesh of the world
            from torch_tensorrt_dist.parallel.moe import make_moe_mesh, moe_groups
            from torch_tensorrt_dist.parallel.moe_load import load_moe

            groups = moe_groups(make_moe_mesh(case["ep"], world // case["ep"]))
            model = load_moe(case["path"], groups=groups, progress=False)
        else:
            model = load_llama(case["path"], group=dist.group.WORLD, progress=False)
        spec = case.get("speculative")  # SpeculativeConfig's fields
        if spec is not None:
            from torch_tensorrt_dist.generation.speculative import SpeculativeConfig

            spec = SpeculativeConfig(**spec)
        size = {"cache_len": case["cache_len"]} if "cache_len" in case else {}
        gen = make_generator(model, case.get("kv_blocks"), speculative=spec, **size)
        jobs = [Job(**j) for j in case["jobs"]]
        grammars = None
        if case.get("tokenizer"):  # structured output over the checkpoint's tokenizer
            from torch_tensorrt_dist.generation.grammar import Grammars

            grammars = Grammars.from_file(
                case["tokenizer"], vocab_size=model.args.vocab_size, eos_ids=case["stop_ids"]
            )
        results.append(run_schedule(gen, jobs, tuple(case["stop_ids"]), grammars))
    return results
