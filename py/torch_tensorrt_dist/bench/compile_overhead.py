"""Compile overhead: our lowering and checks against Dynamo + AOTAutograd capture alone.

One compile per model size: the backend records the time of its lowering in each graph's
report (fusion, report, TensorRT capability decisions); the rest of the first call (Dynamo,
AOTAutograd; the eager engine builds nothing) is capture.
"""

from __future__ import annotations

import time

import torch
import torch._dynamo

from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.bench.common import Figure, bench_args
from torch_tensorrt_dist.generation.runner import decode_example, paged_step, setup_example
from torch_tensorrt_dist.parallel.llama_load import random_llama

__all__ = ["compile_overhead"]


def _measure(n_layers: int, tp: int) -> tuple[float, float]:
    """(capture seconds, lowering seconds) for the decode step of an ``n_layers`` model."""
    import torch.distributed as dist

    args = bench_args(n_layers, dim=128, vocab=256)
    with fake_world(0, tp):
        model = random_llama(args, group=dist.group.WORLD)
        setup_example(model, 1, 64)

        torch._dynamo.reset()
        compiled = torch.compile(
            paged_step(model),
            backend="torch_tensorrt_dist",
            options={"engine": "eager", "check_schedule": False},
            fullgraph=True,
        )
        inputs = decode_example(1)
        with recording() as graphs, torch.no_grad():
            start = time.perf_counter()
            compiled(*inputs)  # the first call compiles (eager engine: no engine build)
            total = time.perf_counter() - start
        torch._dynamo.reset()
    lowering = sum(g.lowering_s for g in graphs)
    return total - lowering, lowering


def compile_overhead(layers: tuple[int, ...] = (2, 8, 32), tp: int = 2) -> list[Figure]:
    figures = []
    per_layer = []
    for n in layers:
        capture, lowering = _measure(n, tp)
        share = lowering / capture
        per_layer.append(lowering / n)
        figures.append(
            Figure(
                "compile overhead",
                f"{n} layers: lowering / capture",
                round(100 * share, 2),
                "%",
                goal="< 5 %",
                met=share < 0.05,
                note=f"lowering {lowering * 1e3:.1f} ms, capture {capture:.2f} s",
            )
        )
    growth = per_layer[-1] / per_layer[0] if per_layer[0] > 0 else float("nan")
    figures.append(
        Figure(
            "compile overhead",
            f"lowering per layer, {layers[-1]} vs {layers[0]} layers",
            round(growth, 2),
            "x",
            goal="~1 (linear in layers)",
            met=growth < 2.0,
        )
    )
    return figures
