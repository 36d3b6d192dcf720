"""What ``verify`` costs after the first call: the decode step verified vs not, same run.

Both variants compile the same Llama decode step with the eager engine in one process; after
their first call (the verified one checks itself there) they are timed in alternating blocks,
on one thread, so machine noise hits both alike, and each variant's best block is its figure
(load only ever slows a block); runs here differ by about 2 % either way. The wrapper's own
cost is also timed around an engine that returns at once, where nothing hides it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch._dynamo
from torch import fx

from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.backend.verify import reference_graph, with_verification
from torch_tensorrt_dist.bench.common import Figure, bench_args
from torch_tensorrt_dist.generation.runner import decode_example, paged_step, setup_example
from torch_tensorrt_dist.parallel.llama_load import random_llama

__all__ = ["verify_cost"]

SECTION = "verify"


def _per_call_s(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _time_blocks(
    steps: list[Any], inputs: tuple[Any, ...], times: list[list[float]], blocks: int, calls: int
) -> None:
    for _ in range(blocks):
        for i, step in enumerate(steps):
            times[i].append(_per_call_s(partial(step, *inputs), calls))


def _decode_steps(n_layers: int, blocks: int, calls: int) -> tuple[float, float, int]:
    """(unverified s/call, verified s/call, graphs compiled while timing)."""
    model = random_llama(bench_args(n_layers, dim=128, vocab=256))
    setup_example(model, 1, 64)
    inputs = decode_example(1)
    torch._dynamo.reset()
    steps = [
        torch.compile(
            paged_step(model),
            backend="torch_tensorrt_dist",
            options={"engine": "eager", "verify": verify},
            fullgraph=True,
        )
        for verify in (False, True)
    ]
    times: list[list[float]] = [[], []]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is steadier on a shared machine
    try:
        with torch.no_grad():
            for step in steps:
                step(*inputs)  # compile; the verified one checks its first call
            with recording() as graphs:
                _time_blocks(steps, inputs, times, blocks, calls)
    finally:
        torch.set_num_threads(threads)
    torch._dynamo.reset()
    return min(times[0]), min(times[1]), len(graphs)


def _wrapper_s(calls: int, repeats: int = 15) -> float:
    """Seconds per call the wrapper adds after its first call (best of alternating repeats)."""
    g = fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.ops.aten.neg.default, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    t = torch.ones(1)
    out = [torch.neg(t)]

    def run(args: list[Any]) -> list[Any]:  # an engine that costs nothing, to expose the wrapper
        return out

    verified = with_verification(
        run, reference_graph(gm), collectives=[], engine="eager", timeout_s=1.0
    )
    verified([t])  # the first call: checked
    plain, wrapped = [], []
    for _ in range(repeats):
        plain.append(_per_call_s(lambda: run([t]), calls))
        wrapped.append(_per_call_s(lambda: verified([t]), calls))
    return max(0.0, min(wrapped) - min(plain))


def verify_cost(
    n_layers: int = 2, *, blocks: int = 30, calls: int = 10, wrapper_calls: int = 20_000
) -> list[Figure]:
    plain, verified, recompiles = _decode_steps(n_layers, blocks, calls)
    ratio = verified / plain
    wrapper = _wrapper_s(wrapper_calls)
    return [
        Figure(
            SECTION,
            f"decode step after the first call, verified / not ({n_layers} layers, eager)",
            round(ratio, 3),
            "x",
            goal="~1 (< 1.05)",
            met=ratio < 1.05,
            note=f"{verified * 1e3:.3f} vs {plain * 1e3:.3f} ms per call, best of {blocks} "
            f"alternating blocks of {calls}, 1 thread",
        ),
        Figure(
            SECTION,
            "verify wrapper cost per call after the first",
            round(wrapper * 1e6, 3),
            "us",
            goal="< 1 us",
            met=wrapper < 1e-6,
            note="a flag check: an engine that returns at once, wrapped vs bare, best of 15",
        ),
        Figure(
            SECTION,
            "graphs compiled while timing (recompiles)",
            recompiles,
            goal="0",
            met=recompiles == 0,
        ),
    ]
