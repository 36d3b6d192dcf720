"""The serving benchmark's in-process parts: the decode step against the reserved cache, KV
bytes per live token, and ``generate``'s decode speed (issue 27).

    times = decode_step_times(path, caches=(256, 1024, 4096), live=33)   # {(L, rows): s}
    kv_bytes_per_live_token(layout, live=33, cache_len=4096)              # paged, static
    gen, graphs = server_generator(path, engine="inductor", max_batch_size=32, ...)
    generate_speed(gen, ids, max_new_tokens=64)                            # decode tok/s

The decode step: one ``Generator(model, engine="inductor", max_batch_size=8, cache_len=L)`` per
cache length L (each its own copy of the model, as ``setup_paged`` sizes the model's block
pools), then rounds that time a few steps of each in turn (8 rows by default, every row at
``live`` tokens: ``live - 1`` in its blocks and the one it decodes), so that a loaded machine
slows all of them alike. A step here is what the core does per step: its inputs built, one call
of the compiled graph.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.generation.kv_blocks import blocks_for
from torch_tensorrt_dist.generation.kv_memory import KVLayout

__all__ = ["decode_step_times", "generate_speed", "kv_bytes_per_live_token", "server_generator"]


def kv_bytes_per_live_token(layout: KVLayout, *, live: int, cache_len: int) -> tuple[float, float]:
    """KV bytes a sequence of ``live`` tokens holds per live token: in the paged cache (whole
    blocks), and in a static cache of ``cache_len`` tokens per row (the old core's)."""
    paged = blocks_for(live, layout.block_size) * layout.bytes_per_block
    return paged / live, cache_len * layout.bytes_per_token / live


def decode_step_times(
    path: str | Path,
    *,
    caches: Sequence[int] = (256, 1024, 4096),
    rows: Sequence[int] = (8,),
    live: int = 33,
    rounds: int = 5,
    steps: int = 10,
    engine: str = "inductor",
) -> dict[tuple[int, int], float]:
    """Median seconds of a decode step, by (cache length, rows), every row at ``live`` tokens
    (see the module docstring). Runs with one torch thread, as a server's rank does."""
    import torch

    from torch_tensorrt_dist.bench.common import bench_rank
    from torch_tensorrt_dist.generation.runner import StepRunner
    from torch_tensorrt_dist.generation.step_inputs import step_inputs

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rank = bench_rank(path, engine=engine)
        runners = {c: rank.generator(rows=max(rows), cache_len=c).runner for c in caches}
        calls = {}
        for (c, run), r in ((g, r) for g in runners.items() for r in rows):
            n = blocks_for(live, run.block_size)
            spans = [([1], live - 1, list(range(1 + i * n, 1 + (i + 1) * n))) for i in range(r)]

            def call(run: StepRunner = run, spans: Any = spans) -> None:
                run.step(*step_inputs(spans, run.limits, run.device, mark_dynamic=run.mark_dynamic))

            with torch.no_grad():  # as timed below (and as the core calls it)
                call()  # compiles this shape
            calls[c, r] = call
        times: dict[tuple[int, int], list[float]] = {key: [] for key in calls}
        with torch.no_grad():
            for _ in range(rounds):
                for key, call in calls.items():
                    for _ in range(steps):
                        start = time.perf_counter()
                        call()
                        times[key].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(saved)
    return {key: statistics.median(t) for key, t in times.items()}


def server_generator(
    path: str | Path,
    *,
    engine: str,
    max_batch_size: int,
    cache_len: int,
    kv_cache_memory: int,
) -> tuple[Any, int]:
    """A ``Generator`` of the server's shape (one rank, one thread), warmed up as the server's
    is (``warmup_all``), and the number of graphs that compiled."""
    import torch
    from torch._dynamo.utils import counters

    from torch_tensorrt_dist.bench.common import bench_rank

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rank = bench_rank(path, engine=engine, kv_cache_memory=kv_cache_memory)
        gen = rank.generator(rows=max_batch_size, cache_len=cache_len)
        before = counters["stats"]["unique_graphs"]
        gen.warmup_all()
        return gen, counters["stats"]["unique_graphs"] - before
    finally:
        torch.set_num_threads(saved)


def generate_speed(gen: Any, prompt: list[int], *, max_new_tokens: int) -> float:
    """``generate``'s decode tokens/s on ``prompt`` alone, one thread (what ``torchtrt-dist
    generate`` reports). Time a generator's second call: its first fills caches."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return float(gen.generate([prompt], max_new_tokens=max_new_tokens).tokens_per_s)
    finally:
        torch.set_num_threads(saved)
