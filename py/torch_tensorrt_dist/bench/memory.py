"""Peak memory per rank while loading a sharded checkpoint, against the checkpoint's size.

Writes a synthetic Hugging Face Llama checkpoint (random weights, 120 MiB in fp32; the input
embedding is 6.7 % of it, as in Llama-3.1-8B) to a temporary folder, then loads it at TP 2 and
TP 4 on gloo ranks with the default plan (embedding and LM head split by vocabulary rows). Each
rank reports the growth of its peak resident memory (``VmHWM``) across ``load_llama``: the
weights it keeps plus what the reading needed on top (positioned reads into the parameters; a
read buffer where a dtype or device differs).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.bench.common import Figure, bench_args
from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = ["load_rank", "memory", "write_checkpoint"]

ARGS = bench_args(8, dim=512, vocab=4096, intermediate_size=1536)


def write_checkpoint(path: Path, args: ModelArgs = ARGS) -> int:
    """A random-weight HF Llama checkpoint; returns the weight bytes."""
    from torch_tensorrt_dist.models.weights_check import llama_tensors
    from torch_tensorrt_dist.testing.checkpoints import llama_config
    from torch_tensorrt_dist.testing.checkpoints import write_checkpoint as write

    return write(path, llama_config(args), llama_tensors(args))


def _hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def load_rank(rank: int, world: int, path: str) -> dict[str, Any]:
    import torch.distributed as dist

    from torch_tensorrt_dist.models.llama import Transformer
    from torch_tensorrt_dist.parallel.llama_load import load_llama

    # The first model built on the meta device imports torch._refs, sympy and Dynamo (~200 MiB,
    # once per process, whatever the checkpoint's size; compiling needs them anyway): pay that
    # before the window, which then holds what loading the weights costs.
    with torch.device("meta"):
        Transformer(ModelArgs(dim=8, n_layers=1, n_heads=1, vocab_size=8, intermediate_size=8))
    before = _hwm_bytes()
    model = load_llama(path, group=dist.group.WORLD, progress=False)
    after = _hwm_bytes()
    kept = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"peak_growth": after - before, "kept": kept}


def memory(tps: tuple[int, ...] = (2, 4)) -> list[Figure]:
    from torch_tensorrt_dist.testing import run_on_ranks

    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        size = write_checkpoint(Path(tmp))
        for tp in tps:
            results = run_on_ranks(load_rank, tp, tmp, timeout=600)
            worst = max(r["peak_growth"] for r in results)
            share = worst / size
            goal = 1 / tp + 0.10
            figures.append(
                Figure(
                    "memory (load)",
                    f"tp={tp} peak growth per rank / checkpoint",
                    round(share, 3),
                    goal=f"<= {goal:.3f} (1/tp + 10 %)",
                    met=share <= goal,
                    note=(
                        f"checkpoint {size / 2**20:.0f} MiB; worst rank +"
                        f"{worst / 2**20:.0f} MiB; weights kept "
                        f"{max(r['kept'] for r in results) / 2**20:.0f} MiB"
                    ),
                )
            )
    return figures
