"""Weight-only quantization on CPU: weight bytes, decode speed and load peak per rank, at TP 1
and TP 2 (gloo), fp32 / bf16 / int8 / int4 measured in the same run, one thread per rank.

A random-weight Llama (hidden 1024, 12 layers, 16 query / 8 KV heads, MLP 2816, vocabulary
8192: 140 M parameters in the decoder, 560 MB in fp32, well beyond this CPU's caches) is written
once as a checkpoint; each rank loads its slices of it (``load_llama``) in fp32 or bf16, the
int8 / int4 runs quantize their bf16 slices (``quantize_model``; the weight-only kernels compute
in bf16 on CPU). Decode steps run as plain PyTorch (the aten kernels a compiled step calls:
``tests/test_quantization.py`` checks Inductor's decode graph calls exactly these weight-only
kernels; compiling 4 x 12-layer graphs per rank would take this bench from minutes to a
quarter of an hour on 2 cores); each config is timed 3 times over 16 steps, interleaved, and
the best is kept.
The load peak is the growth of the rank's peak resident memory (``VmHWM``, reset before each
load) across loading and quantizing; its bound is the model-dtype slice plus its quantized copy.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.bench.common import Figure, bench_args
from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = ["ARGS", "quantize_figures", "quantize_rank"]

ARGS = bench_args(12, dim=1024, vocab=8192, n_heads=16, intermediate_size=2816)
#: name -> (model dtype, scheme, group size)
CONFIGS: dict[str, tuple[torch.dtype, str | None, int | None]] = {
    "fp32": (torch.float32, None, None),
    "bf16": (torch.bfloat16, None, None),
    "int8": (torch.bfloat16, "int8", None),
    "int4": (torch.bfloat16, "int4", 128),
}
STEPS = 16
ROUNDS = 3


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Reset the peak resident memory to the current one (Linux ``clear_refs``); return it."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def _decode_seconds(model: Any, steps: int) -> float:
    """Seconds per decode step of ``model`` (plain PyTorch: the same aten kernels a compiled
    step calls, without minutes of compiling four 12-layer graphs per rank)."""
    tokens, pad = torch.ones(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        model(tokens, torch.tensor([0]), pad)  # warm up
        start = time.perf_counter()
        for slot in range(1, 1 + steps):
            model(tokens, torch.tensor([slot]), pad)
        return (time.perf_counter() - start) / steps


def quantize_rank(
    rank: int, world: int, path: str, steps: int = STEPS, rounds: int = ROUNDS
) -> dict[str, Any]:
    """One rank: load (and quantize) every config, each load's peak measured on its own; then
    ``rounds`` interleaved timings of ``steps`` decode steps per config, the best kept (the
    machine's load moves all four alike within a round)."""
    import torch.distributed as dist

    from torch_tensorrt_dist.models.llama import Transformer
    from torch_tensorrt_dist.parallel.llama_load import load_llama
    from torch_tensorrt_dist.quantization import QuantConfig, quantize_model, weight_bytes

    # the first model built on the meta device imports torch._refs, sympy and Dynamo (~200
    # MiB once per process, bench/memory.py): paid before the first window, not in it
    with torch.device("meta"):
        Transformer(ModelArgs(dim=8, n_layers=1, n_heads=1, vocab_size=8, intermediate_size=8))
    group = dist.group.WORLD if world > 1 else None
    out: dict[str, Any] = {}
    models: dict[str, Any] = {}
    for name, (dtype, scheme, group_size) in CONFIGS.items():
        gc.collect()
        base = _reset_peak()
        model = load_llama(path, group=group, dtype=dtype, progress=False)
        dense = weight_bytes(model)
        if scheme is not None:
            quantize_model(model, QuantConfig(scheme, group_size), engine="none")
        peak = _status("VmHWM") - base
        model.setup_caches(1, steps + 1)
        models[name] = model
        out[name] = {"bytes": weight_bytes(model), "dense_bytes": dense, "peak": peak}
    for _ in range(rounds):
        for name, model in models.items():
            if world > 1:
                dist.barrier()
            seconds = _decode_seconds(model, steps)
            best = out[name].get("s_per_token", seconds)
            out[name]["s_per_token"] = min(best, seconds)
    return out


def _write_checkpoint(path: Path) -> int:
    from torch_tensorrt_dist.bench.memory import write_checkpoint

    return write_checkpoint(path, ARGS)


def quantize_figures(tps: tuple[int, ...] = (1, 2)) -> list[Figure]:
    from torch_tensorrt_dist.testing import run_on_ranks

    figures: list[Figure] = []
    section = "quantize (CPU, 1 thread/rank)"
    # fixed mmap threshold: freed weights go back to the OS, so each load's peak is its own
    old = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            size = _write_checkpoint(Path(tmp))
            results = {tp: run_on_ranks(quantize_rank, tp, tmp, timeout=1200) for tp in tps}
    finally:
        if old is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = old
    for tp, ranks in results.items():
        figures += _tp_figures(section, tp, ranks, size)
    return figures


def _tp_figures(section: str, tp: int, ranks: list[dict[str, Any]], size: int) -> list[Figure]:
    r0 = ranks[0]
    tok_s = {name: 1 / r0[name]["s_per_token"] for name in CONFIGS}
    fp32 = r0["fp32"]["bytes"]
    out: list[Figure] = []
    for name in CONFIGS:
        res = r0[name]
        worst_peak = max(r[name]["peak"] for r in ranks)
        bound = res["dense_bytes"] + (res["bytes"] if CONFIGS[name][1] else 0)
        out.append(
            Figure(
                section,
                f"tp={tp} {name}: decode",
                round(tok_s[name], 2),
                "tok/s",
                note=(
                    f"weights/rank {res['bytes'] / 2**20:.0f} MiB ({res['bytes'] / fp32:.3f} of "
                    f"fp32); load peak/rank +{worst_peak / 2**20:.0f} MiB "
                    f"({worst_peak / bound:.2f} of the {CONFIGS[name][0]} slice"
                    + (" + codes" if CONFIGS[name][1] else "")
                    + ")"
                ),
            )
        )
    best_dense = max(tok_s["fp32"], tok_s["bf16"])
    int8, int4 = tok_s["int8"] / best_dense, tok_s["int4"] / tok_s["int8"]
    goal8 = tp == 1
    out.append(
        Figure(
            section,
            f"tp={tp} int8 vs the faster of fp32 and bf16",
            round(int8, 2),
            "x",
            goal=">= 1.5x" if goal8 else "",
            met=(int8 >= 1.5) if goal8 else None,
            note="kernel aten._weight_int8pack_mm, bf16 activations"
            + ("" if goal8 else "; gloo's per-collective latency sets a floor at tp 2"),
        )
    )
    out.append(
        Figure(
            section,
            f"tp={tp} int4 vs int8",
            round(int4, 2),
            "x",
            goal="> 1x",
            met=int4 > 1,
            note="kernel aten._weight_int4pack_mm_for_cpu, bf16 activations",
        )
    )
    peaks = [
        r[n]["peak"] / (r[n]["dense_bytes"] + r[n]["bytes"])
        for r in ranks
        for n in ("int8", "int4")
    ]
    out.append(
        Figure(
            section,
            f"tp={tp} quantized load peak / (bf16 slice + codes), worst rank",
            round(max(peaks), 3),
            goal="<= 1",
            met=max(peaks) <= 1,
            note=f"checkpoint {size / 2**20:.0f} MiB fp32; raw: {json.dumps(_raw(ranks))}",
        )
    )
    return out


def _raw(ranks: list[dict[str, Any]]) -> dict[str, list[int]]:
    return {n: [round(r[n]["peak"] / 2**20) for r in ranks] for n in CONFIGS}
