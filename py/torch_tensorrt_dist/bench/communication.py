"""Communication per decoder layer per decode step, read from the compiled decode graph.

The limit for a tensor-parallel decoder layer is 2 all_reduces of ``batch x hidden`` values
(after attention's output projection and after the MLP's down projection).
"""

from __future__ import annotations

import torch

from torch_tensorrt_dist.backend.explain import explain
from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.bench.common import Figure, bench_args
from torch_tensorrt_dist.generation.runner import decode_example, paged_step, setup_example
from torch_tensorrt_dist.parallel.llama import LMHead
from torch_tensorrt_dist.parallel.llama_load import random_llama

__all__ = ["communication"]


def decode_collectives(
    tp: int,
    *,
    n_layers: int = 4,
    batch: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    vocab: LMHead = "vocab_parallel",
):
    """The explain report of one decode step of the Llama plan at ``tp`` (fake process group);
    ``vocab`` lays out the embedding and the LM head."""
    args = bench_args(n_layers)
    with fake_world(0, tp):
        import torch.distributed as dist

        model = random_llama(
            args, group=dist.group.WORLD, dtype=dtype, lm_head=vocab, embedding=vocab
        )
        setup_example(model, batch, 64)
        report = explain(paged_step(model), *decode_example(batch))
    return args, report


def communication(tps: tuple[int, ...] = (2, 4, 8), batch: int = 1) -> list[Figure]:
    figures = []
    dtype = torch.bfloat16
    for tp in tps:
        args, report = decode_collectives(tp, batch=batch, dtype=dtype)
        in_layers = [c for c in report.collectives if c.module.startswith("layers.")]
        per_layer = [c for c in in_layers if c.op == "all_reduce"]
        other = [c for c in report.collectives if c not in in_layers]
        other += [c for c in in_layers if c.op != "all_reduce"]
        n = args.n_layers
        limit = 2 * batch * args.dim * dtype.itemsize
        got = sum(c.bytes for c in per_layer) / n
        figures += [
            Figure(
                "communication",
                f"tp={tp} graphs / breaks",
                f"{report.graph_count} / {len(report.graph_breaks)}",
                goal="1 / 0",
                met=report.graph_count == 1 and not report.graph_breaks,
            ),
            Figure(
                "communication",
                f"tp={tp} all_reduces per layer",
                len(per_layer) / n,
                goal="2",
                met=len(per_layer) == 2 * n and len(in_layers) == len(per_layer),
            ),
            Figure(
                "communication",
                f"tp={tp} bytes per layer per step",
                got,
                "B",
                goal=f"<= {limit} (2 x batch x hidden x {dtype.itemsize} B)",
                met=got <= limit,
                note=(
                    "plus once per step: " + ", ".join(f"{c.op} {c.bytes} B" for c in other)
                    if other
                    else ""
                ),
            ),
        ]
    return figures
