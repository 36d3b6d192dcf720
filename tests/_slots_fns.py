"""A scripted serving schedule over the generation core (joins and cancels at given steps), run
in one process and in spawned gloo ranks by ``test_slots.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.generation.slots import Request

ROWS = 3
CACHE_LEN = 64


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
    """One request of the schedule: joins at ``step`` (or later, when no slot is free)."""

    step: int
    prompt: list[int]
    max_new: int
    cancel_at: int | None = None  # a step at which the client goes away
    sampling: dict[str, Any] = field(default_factory=dict)

    def request(self, rid: int, stop_ids: tuple[int, ...]) -> Request:
        cfg = SamplingConfig(**self.sampling)
        return Request(rid, tuple(self.prompt), self.max_new, cfg, stop_ids)


def run_schedule(gen: Generator, jobs: list[Job], stop_ids: tuple[int, ...]) -> dict[str, Any]:
    """Run ``jobs`` through ``gen``'s slots as a server would; tokens per job, steps taken and
    the slot each job got."""
    slots = gen.slots()
    out: dict[int, list[int]] = {i: [] for i in range(len(jobs))}
    slot_of: dict[int, int] = {}
    waiting: list[int] = []
    step = 0
    while step <= max(j.step for j in jobs) or waiting or slots.active:
        for rid, job in enumerate(jobs):
            if job.cancel_at == step:
                slots.cancel(rid)
                if rid in waiting:
                    waiting.remove(rid)
            if job.step == step:
                waiting.append(rid)
        while waiting and slots.free_slots():
            rid = waiting.pop(0)
            slot_of[rid] = slots.free_slots()[0]
            out[rid] += slots.join(jobs[rid].request(rid, stop_ids), slot_of[rid]).tokens
        for e in slots.decode():
            out[e.rid] += e.tokens
        step += 1
        if step > 500:
            raise RuntimeError("the schedule did not finish")
    return {"tokens": [out[i] for i in range(len(jobs))], "steps": step, "slots": slot_of}


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
        gen = Generator(model, max_batch_size=ROWS, cache_len=CACHE_LEN)
        jobs = [Job(**j) for j in case["jobs"]]
        results.append(run_schedule(gen, jobs, tuple(case["stop_ids"])))
    return results
