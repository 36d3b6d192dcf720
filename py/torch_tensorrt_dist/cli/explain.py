"""``torchtrt-dist explain``: how a built-in sharded model compiles on one rank of a big job.

    torchtrt-dist explain --model mlp --world-size 8 --tp 4 --rank 5

Runs on a fake process group in this one CPU process: nothing is communicated, the graphs and
collectives are exactly those the rank would compile.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["BUILTIN_MODELS", "register"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _mlp(mesh: Any, args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from torch_tensorrt_dist.models.toy import MLP
    from torch_tensorrt_dist.parallel.plans import tensor_parallel_mlp

    model = tensor_parallel_mlp(MLP(args.dim, 4 * args.dim), mesh)
    return model, (torch.randn(args.batch, args.dim),)


def _mlp_sp(mesh: Any, args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from torch_tensorrt_dist.models.toy import NormMLP
    from torch_tensorrt_dist.parallel.plans import sequence_parallel_block

    model = sequence_parallel_block(NormMLP(args.dim, 4 * args.dim), mesh)
    local_seq = max(1, args.seq // mesh.size())
    return model, (torch.randn(args.batch, local_seq, args.dim),)


def _funcol_mlp(mesh: Any, args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from torch_tensorrt_dist.models.toy import MLP
    from torch_tensorrt_dist.parallel.plans import FunctionalTPMLP

    return FunctionalTPMLP(MLP(args.dim, 4 * args.dim), mesh), (torch.randn(args.batch, args.dim),)


def _all_to_all(mesh: Any, args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from torch_tensorrt_dist.parallel.plans import ShardSwap

    return ShardSwap(mesh, args.dim), (torch.randn(args.batch, args.dim),)


def _block(mesh: Any, args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from torch_tensorrt_dist.models.toy import Block
    from torch_tensorrt_dist.parallel.plans import tensor_parallel_block

    model = tensor_parallel_block(Block(args.dim, n_heads=max(4, mesh.size())), mesh)
    return model, (torch.randn(args.batch, args.seq, args.dim),)


#: name -> (description, builder(tp_mesh, args) -> (model, example inputs))
BUILTIN_MODELS: dict[str, tuple[str, Callable[[Any, argparse.Namespace], Any]]] = {
    "mlp": ("DTensor column/row-parallel MLP (1 all_reduce)", _mlp),
    "block": ("DTensor attention + MLP block, torchtitan plan (2 all_reduces)", _block),
    "mlp-sp": ("sequence-parallel norm + MLP block (all_gather + reduce_scatter)", _mlp_sp),
    "funcol-mlp": ("hand-sharded MLP with a functional all_reduce", _funcol_mlp),
    "all-to-all": ("row <-> column re-sharding through all_to_all", _all_to_all),
}


def register(sub: Any) -> None:
    models = "; ".join(f"{k}: {v[0]}" for k, v in BUILTIN_MODELS.items())
    p = sub.add_parser(
        "explain",
        help="show graphs, graph breaks and collectives of a sharded model (fake process group)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="mlp", choices=sorted(BUILTIN_MODELS), help=models)
    p.add_argument("--world-size", type=int, default=2, help="ranks in the job (default 2)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default: all)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel degree (default: W/tp)")
    p.add_argument("--rank", type=int, default=0, help="which rank to explain (default 0)")
    p.add_argument("--dim", type=int, default=64, help="model width")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16, help="sequence length (mlp-sp)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torch_tensorrt_dist.backend.explain import explain
    from torch_tensorrt_dist.backend.fake_world import fake_world
    from torch_tensorrt_dist.parallel.mesh import make_mesh

    tp = args.tp or args.world_size
    if args.dim % tp:
        raise ConfigError(f"--dim {args.dim} must be divisible by --tp {tp}")
    _, build = BUILTIN_MODELS[args.model]
    with fake_world(args.rank, args.world_size):
        mesh = make_mesh(tp=tp, dp=args.dp)
        torch.manual_seed(0)
        model, inputs = build(mesh["tp"], args)
        dtype = _DTYPES[args.dtype]
        model = model.to(dtype)
        inputs = tuple(x.to(dtype) for x in inputs)
        report = explain(model, *inputs)
    print(report.to_json() if args.json else report)
    return 0
