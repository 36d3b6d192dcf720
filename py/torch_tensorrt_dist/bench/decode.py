"""Decode speed on CPU at TP 2 (gloo), in one run of 2 ranks, reported as ratios.

Three ways to run the same small Llama (same weights, same prompt, same number of tokens):
- compiled TP: hand-sharded weights and 2 functional all_reduces per layer (plus the
  vocabulary-parallel embedding's all_reduce and the logits' all_gather), prefill and decode
  compiled by our backend (``inductor`` engine): what this package does;
- compiled TP in the eager baseline's layout (embedding and LM head replicated): the same
  collectives as the baseline, so the ratio compares the rest of the step;
- eager DTensor TP: the same model sharded with ``parallelize_module`` (Colwise q/k/v/gate/up,
  Rowwise o/down) and run eagerly: what torchchat's ``--distributed`` path runs;
- unsharded compiled: one process, the whole model, compiled by Inductor through our backend.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from torch_tensorrt_dist.bench.common import Figure, bench_args

__all__ = ["decode_rank", "decode_speed"]


def _dtensor_tp(model: Any, mesh: Any) -> Any:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    tp = mesh.size()
    plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.blocks:
        parallelize_module(block, mesh, plan)
        block.attention.n_heads //= tp  # local heads (DTensor hands out local shards)
        block.attention.n_kv_heads //= tp
    return model


def _time_decode(model: Any, engine: str, prompt: list[int], tokens: int) -> dict[str, Any]:
    from torch_tensorrt_dist.generation.generate import Generator

    gen = Generator(model, engine=engine, max_batch_size=1, cache_len=128)
    gen.generate([prompt], max_new_tokens=4)  # warm-up: compiles prefill and decode
    result = gen.generate([prompt], max_new_tokens=tokens)
    return {
        "ms_per_token": 1e3 * result.decode_s / max(result.decode_steps, 1),
        "ttft_s": result.ttft_s,
        "tokens": result.tokens[0],
    }


def decode_rank(rank: int, world: int, n_layers: int, tokens: int) -> dict[str, Any]:
    """One rank of the decode benchmark (run with run_on_ranks(..., 2, ...))."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from torch_tensorrt_dist.parallel.llama_load import random_llama

    torch.manual_seed(0)
    args = bench_args(n_layers)
    prompt = [1, 17, 33, 5, 9, 100, 7]
    out: dict[str, Any] = {}
    x = torch.ones(1, 1, args.dim)
    for _ in range(10):
        dist.all_reduce(x)
    start = time.perf_counter()
    for _ in range(100):
        dist.all_reduce(x)
    out["all_reduce_ms"] = 1e3 * (time.perf_counter() - start) / 100
    full = random_llama(args, seed=0)  # the same full weights on every rank
    with torch.no_grad():
        out["compiled_tp"] = _time_decode(
            random_llama(args, seed=0, group=dist.group.WORLD), "inductor", prompt, tokens
        )
        replicated = random_llama(
            args, seed=0, group=dist.group.WORLD, lm_head="replicated", embedding="replicated"
        )
        out["compiled_tp_replicated"] = _time_decode(replicated, "inductor", prompt, tokens)
        mesh = init_device_mesh("cpu", (world,))
        out["eager_dtensor_tp"] = _time_decode(
            _dtensor_tp(copy.deepcopy(full), mesh), "none", prompt, tokens
        )
        dist.barrier()
        if rank == 0:  # the other rank idles: the unsharded run has the machine to itself
            out["unsharded_compiled"] = _time_decode(full, "inductor", prompt, tokens)
        dist.barrier()
    return out


def decode_speed(n_layers: int = 4, tokens: int = 32) -> list[Figure]:
    from torch_tensorrt_dist.bench.communication import decode_collectives
    from torch_tensorrt_dist.testing import run_on_ranks

    # collectives per decode step, read from the compiled graphs (fake process group); the
    # DTensor baseline's layout (replicated embedding and head) has the same as ours in it
    steps = len(decode_collectives(2, n_layers=n_layers)[1].collectives)
    steps_repl = len(decode_collectives(2, n_layers=n_layers, vocab="replicated")[1].collectives)
    results = run_on_ranks(decode_rank, 2, n_layers, tokens, timeout=1800)
    r0 = results[0]
    ours = r0["compiled_tp"]["ms_per_token"]
    ours_repl = r0["compiled_tp_replicated"]["ms_per_token"]
    eager = r0["eager_dtensor_tp"]["ms_per_token"]
    single = r0["unsharded_compiled"]["ms_per_token"]
    same = r0["compiled_tp"]["tokens"] == r0["eager_dtensor_tp"]["tokens"]
    same = same and r0["compiled_tp"]["tokens"] == r0["unsharded_compiled"]["tokens"]
    same = same and r0["compiled_tp"]["tokens"] == r0["compiled_tp_replicated"]["tokens"]
    floor = r0["all_reduce_ms"] * steps
    floor_repl = r0["all_reduce_ms"] * steps_repl
    above_repl = (eager - floor_repl) / max(ours_repl - floor_repl, 1e-9)
    return [
        Figure(
            "decode (CPU, gloo, TP 2)",
            "communication floor per token",
            round(floor, 2),
            "ms/token",
            note=f"{steps} collectives x {r0['all_reduce_ms']:.3f} ms (gloo, loopback)",
        ),
        Figure("decode (CPU, gloo, TP 2)", "compiled TP (inductor)", round(ours, 2), "ms/token"),
        Figure(
            "decode (CPU, gloo, TP 2)",
            "compiled TP, replicated embedding + head",
            round(ours_repl, 2),
            "ms/token",
            note=f"the baseline's layout: floor {floor_repl:.2f} ms ({steps_repl} collectives)",
        ),
        Figure("decode (CPU, gloo, TP 2)", "eager DTensor TP", round(eager, 2), "ms/token"),
        Figure(
            "decode (CPU, gloo, TP 2)",
            "unsharded compiled, 1 process",
            round(single, 2),
            "ms/token",
        ),
        Figure(
            "decode (CPU, gloo, TP 2)",
            "speed-up over eager DTensor",
            round(eager / ours, 2),
            "x",
            goal=">= 3x",
            met=eager / ours >= 3,
            note=(
                f"our plan has {steps - steps_repl} more collectives than the baseline's; "
                f"above each one's floor: {(eager - floor_repl) / max(ours - floor, 1e-9):.2f}x"
            ),
        ),
        Figure(
            "decode (CPU, gloo, TP 2)",
            "speed-up over eager DTensor, same layout",
            round(eager / ours_repl, 2),
            "x",
            goal=">= 3x",
            met=eager / ours_repl >= 3,
            note=f"above the floor: {above_repl:.2f}x",
        ),
        Figure(
            "decode (CPU, gloo, TP 2)",
            "compiled TP 2 vs unsharded compiled",
            round(single / ours, 2),
            "x",
            note="> 1: TP 2 is faster; on 2 CPU cores gloo latency dominates tiny models",
        ),
        Figure(
            "decode (CPU, gloo, TP 2)",
            "same greedy tokens in all four",
            same,
            goal="True",
            met=same,
        ),
    ]
