"""MoE figures: collectives and bytes per MoE layer against the minimum, and load memory.

Communication is read from the compiled decode graph of one rank on the fake process group
(``explain_moe``). After attention, every rank of the EP x TP group holds a partial sum of each
token's MoE output (its experts, its TP slice of them) and every rank needs the full sum for
the next layer's attention, so the least a MoE layer can communicate is ONE all-reduce of
``batch x hidden`` values over the EP x TP group: that is the minimum the figure compares with.
``a2a_bytes`` gives, for comparison, what an all-to-all dispatch would send (docs/moe.md).

Load memory: a synthetic Mixtral-style checkpoint is loaded on gloo ranks at each ``(ep, tp)``;
each rank reports the growth of its peak resident memory (``VmHWM``) across ``load_moe``,
against ``expert weights / (ep x tp) + other weights / tp``.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.bench.common import Figure, bench_args
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs

__all__ = ["a2a_bytes", "moe_communication", "moe_figures", "moe_load_memory", "write_moe"]

#: Mixtral-shaped, small: 8 experts, top 2; expert weights are most of the checkpoint (89 %)
ARGS = bench_args(4, dim=256, vocab=1024, intermediate_size=512)
MOE = MoEArgs(n_experts=8, top_k=2, expert_size=512, sparse_layers=(0, 1, 2, 3))


def a2a_bytes(
    *, ep: int, tp: int, tokens: int, dim: int, top_k: int, n_experts: int, itemsize: int
) -> tuple[int, int]:
    """(collectives, bytes a rank sends in) per MoE layer for an all-to-all dispatch with a
    no-drop static capacity, when tokens are replicated over EP (TP attention): dispatch over EP
    (``ep`` slots of ``tokens x min(top_k, E/ep)`` rows), combine back (the same), the TP
    all-reduce of the expert partial sums, and an EP all-gather to re-replicate the output."""
    rows = tokens * min(top_k, n_experts // ep)
    dispatch = ep * rows * dim * itemsize
    count, sent = 2, 2 * dispatch
    if tp > 1:
        count, sent = count + 1, sent + tokens * dim * itemsize
    return count + 1, sent + tokens * dim * itemsize // ep


def moe_communication(
    layouts: tuple[tuple[int, int], ...] = ((2, 1), (2, 2), (2, 4)),
    batch: int = 1,
    *,
    args: ModelArgs = ARGS,
    moe_args: MoEArgs = MOE,
) -> list[Figure]:
    from torch_tensorrt_dist.generation.moe_explain import explain_moe

    figures = []
    dtype = torch.bfloat16
    size = dtype.itemsize
    for ep, tp in layouts:
        report = explain_moe(
            args, moe_args, ep=ep, tp=tp, rank=ep * tp - 1, batch=batch, dtype=dtype, prefill=0
        )
        moe = report.moe_collectives()
        n = len(moe_args.sparse_layers)
        minimum = batch * args.dim * size
        got = sum(c.bytes for c in moe) / n
        a2a_n, a2a_b = a2a_bytes(
            ep=ep,
            tp=tp,
            tokens=batch,
            dim=args.dim,
            top_k=moe_args.top_k,
            n_experts=moe_args.n_experts,
            itemsize=size,
        )
        figures += [
            Figure(
                "moe",
                f"ep={ep} tp={tp} graphs / groups / groups as planned",
                f"{report.decode.graph_count} / {len(report.groups)} / {report.groups_ok}",
                goal=f"1 / {2 if tp > 1 else 1} / True",
                met=report.decode.graph_count == 1
                and report.groups_ok
                and len(report.groups) == (2 if tp > 1 else 1),
            ),
            Figure(
                "moe",
                f"ep={ep} tp={tp} collectives per MoE layer",
                len(moe) / n,
                goal="1",
                met=len(moe) == n,
                note=f"all-to-all dispatch: {a2a_n}",
            ),
            Figure(
                "moe",
                f"ep={ep} tp={tp} bytes per MoE layer per step",
                got,
                "B",
                goal=f"<= {minimum} (batch x hidden x {size} B)",
                met=got <= minimum,
                note=f"all-to-all dispatch: {a2a_b} B",
            ),
        ]
    return figures


def write_moe(path: Path, args: ModelArgs = ARGS, moe: MoEArgs = MOE) -> tuple[int, int]:
    """A random-weight HF Mixtral checkpoint; returns (expert bytes, other bytes)."""
    from torch_tensorrt_dist.models.weights_check import moe_tensors
    from torch_tensorrt_dist.testing.checkpoints import llama_config, write_checkpoint

    config = llama_config(
        args,
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        intermediate_size=moe.expert_size,
        num_local_experts=moe.n_experts,
        num_experts_per_tok=moe.top_k,
    )
    shapes = moe_tensors(args, moe, ())  # one tensor per expert
    total = write_checkpoint(path, config, shapes)
    expert = sum(4 * math.prod(s) for name, s in shapes.items() if ".experts." in name)
    return expert, total - expert


def load_rank(rank: int, world: int, path: str, ep: int) -> dict[str, Any]:
    from torch_tensorrt_dist.bench.memory import _hwm_bytes
    from torch_tensorrt_dist.models.moe import MoETransformer
    from torch_tensorrt_dist.parallel.moe import make_moe_mesh, moe_groups
    from torch_tensorrt_dist.parallel.moe_load import load_moe

    groups = moe_groups(make_moe_mesh(ep, world // ep))
    with torch.device("meta"):  # pay the one-time imports of meta tensors before the window
        MoETransformer(
            ModelArgs(dim=8, n_layers=1, n_heads=1, vocab_size=8, intermediate_size=8),
            MoEArgs(2, 1, 8, sparse_layers=(0,)),
        )
    before = _hwm_bytes()
    model = load_moe(path, groups=groups, progress=False)
    after = _hwm_bytes()
    kept = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"peak_growth": after - before, "kept": kept, "read": model.bytes_read}


def moe_load_memory(layouts: tuple[tuple[int, int], ...] = ((2, 1), (2, 2))) -> list[Figure]:
    from torch_tensorrt_dist.testing import run_on_ranks

    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        expert, rest = write_moe(Path(tmp))
        for ep, tp in layouts:
            results = run_on_ranks(load_rank, ep * tp, tmp, ep, timeout=600)
            worst = max(r["peak_growth"] for r in results)
            bound = expert / (ep * tp) + rest / tp
            figures.append(
                Figure(
                    "moe",
                    f"ep={ep} tp={tp} load peak growth per rank / share",
                    round(worst / bound, 3),
                    goal="<= 1.10 (share: experts/(ep x tp) + rest/tp)",
                    met=worst <= 1.10 * bound,
                    note=(
                        f"checkpoint {(expert + rest) / 2**20:.0f} MiB, share "
                        f"{bound / 2**20:.1f} MiB; worst rank +{worst / 2**20:.1f} MiB, read "
                        f"{max(r['read'] for r in results) / 2**20:.1f} MiB"
                    ),
                )
            )
    return figures


def moe_figures() -> list[Figure]:
    from torch_tensorrt_dist.bench.moe_speed import moe_speed

    return moe_communication() + moe_load_memory() + moe_speed()
