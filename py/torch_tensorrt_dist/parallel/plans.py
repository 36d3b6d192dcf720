"""Tensor-parallel plans for the toy models, the ways users write them.

Each function shards a module in place over a 1-D TP mesh (or a named dim of a bigger mesh) and
returns it. ``explain`` and the tests use them to cover each collective a plan produces.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torch_tensorrt_dist.models.toy import MLP, Block, NormMLP, ToyLM
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead, apply_tp

__all__ = [
    "FunctionalTPMLP",
    "ShardSwap",
    "sequence_parallel_block",
    "tensor_parallel_block",
    "tensor_parallel_mlp",
    "toy_lm_tp",
]


def tensor_parallel_mlp(mlp: MLP, mesh: DeviceMesh) -> MLP:
    """w1 column-, w2 row-parallel: replicated in, replicated out, one all_reduce."""
    parallelize_module(mlp, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    return mlp


def tensor_parallel_block(block: Block, mesh: DeviceMesh) -> Block:
    """torchtitan's plan: q/k/v and w1 column-, wo and w2 row-parallel; 2 all_reduces."""
    parallelize_module(
        block,
        mesh,
        {
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(),
            "mlp.w1": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(),
        },
    )
    return block


def sequence_parallel_block(block: NormMLP, mesh: DeviceMesh) -> NormMLP:
    """Megatron sequence parallel: the norm on sequence shards; all_gather + reduce_scatter.

    Input and output are sequence-sharded (dim 1 of ``[B, S, D]``) local tensors.
    """
    parallelize_module(
        block,
        mesh,
        PrepareModuleInputOutput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Shard(1),),
            use_local_input=False,
            output_layouts=(Shard(1),),
            desired_output_layouts=(Shard(1),),
            use_local_output=True,
        ),
    )
    parallelize_module(
        block,
        mesh,
        {
            "norm": SequenceParallel(use_local_output=False),
            "mlp.w1": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        },
    )
    return block


class FunctionalTPMLP(nn.Module):
    """Hand-sharded MLP with an explicit functional all_reduce (the gpt-fast way).

    Holds this rank's slices: ``w1`` rows and ``w2`` columns of the full weights.
    """

    def __init__(self, full: MLP, mesh: DeviceMesh) -> None:
        super().__init__()
        group = mesh.get_group()
        self.group = group
        n, r = mesh.size(), mesh.get_local_rank()
        h = full.w1.out_features // n
        self.w1 = nn.Linear(full.w1.in_features, h)
        self.w2 = nn.Linear(h, full.w2.out_features)
        with torch.no_grad():
            self.w1.weight.copy_(full.w1.weight[r * h : (r + 1) * h])
            self.w1.bias.copy_(full.w1.bias[r * h : (r + 1) * h])
            self.w2.weight.copy_(full.w2.weight[:, r * h : (r + 1) * h])
            self.w2.bias.copy_(full.w2.bias / n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.w2(torch.nn.functional.gelu(self.w1(x)))
        return funcol.all_reduce(y, "sum", self.group)


class ShardSwap(nn.Module):
    """Row shards -> column shards -> row shards through two all_to_alls (as MoE dispatch does).

    Input: this rank's ``[N/tp, D]`` rows. Each rank scales its column block in between, so the
    data really moves; the output is this rank's rows of ``x_full * scale``. (DTensor's own
    Shard(0) -> Shard(1) redistribution uses all_gather on CPU meshes, all_to_all on CUDA.)
    """

    def __init__(self, mesh: DeviceMesh, dim: int) -> None:
        super().__init__()
        self.group = mesh.get_group()
        self.n, self.r = mesh.size(), mesh.get_local_rank()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, rows, dim = self.n, x.shape[0], x.shape[1]
        d = dim // n
        # [rows, dim] -> [n, rows, d]: block j goes to rank j
        send = x.view(rows, n, d).transpose(0, 1).contiguous().view(n * rows, d)
        cols = funcol.all_to_all_single(send, None, None, self.group)  # [n*rows, d]: all rows
        cols = cols * self.scale[self.r * d : (self.r + 1) * d]
        back = funcol.all_to_all_single(cols, None, None, self.group)  # [n*rows, d]
        # block j holds my rows' column block j -> [rows, dim]
        return back.view(n, rows, d).transpose(0, 1).reshape(rows, dim)


def replicate(t: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    return DTensor.from_local(t, mesh, [Replicate()], run_check=False)


def toy_lm_tp(
    model: ToyLM,
    group: torch.distributed.ProcessGroup | None,
    *,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> ToyLM:
    """The toy family's plan: its modules are the Llama decoder's (q/k/v and gate/up column-,
    o and down row-parallel, the vocabulary split), so it is the Llama plan; the parallel block
    still reduces twice (after attention and after the MLP), each on this ``group``."""
    apply_tp(model, group, lm_head=lm_head, embedding=embedding)
    return model
