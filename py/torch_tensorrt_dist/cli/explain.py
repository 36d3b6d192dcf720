"""``torchtrt-dist explain``: how a built-in sharded model compiles on one rank of a big job.

    torchtrt-dist explain --model mlp --world-size 8 --tp 4 --rank 5
    torchtrt-dist explain --model moe --world-size 8 --ep 2 --tp 4 --rank 5

Runs on a fake process group in this one CPU process: nothing is communicated, the graphs and
collectives are exactly those the rank would compile.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

import torch

from torch_tensorrt_dist.cli._options import add_command
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.validation import check_int

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


def available_memory() -> int | None:
    """Bytes this machine can still give (``MemAvailable``); None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(shapes: dict[str, tuple[int, ...]], checkpoint: str) -> None:
    """Refuse a checkpoint's config whose whole model (``shapes``: its tensors' full shapes;
    explain builds the model with random float32 weights in this process, then shards it)
    needs more than half of the memory left."""
    params = sum(math.prod(shape) for shape in shapes.values())
    need, free = params * 4, available_memory()
    if free is not None and need > free // 2:
        raise ConfigError(
            f"--checkpoint {checkpoint}: explain builds its whole model with random float32 "
            f"weights in this process ({params / 1e9:.2f}B parameters, {need / 2**30:.1f} GiB), "
            f"more than half of the {free / 2**30:.1f} GiB available; explain a copy of its "
            "config.json with fewer num_hidden_layers (the layers repeat)"
        )


def _llama_args(args: argparse.Namespace) -> Any:
    if args.checkpoint:
        from torch_tensorrt_dist.models.llama_args import read_config
        from torch_tensorrt_dist.models.weights_check import llama_tensors

        margs = read_config(args.checkpoint)
        check_fits(llama_tensors(margs), args.checkpoint)
        return margs
    return _random_args(args)


def _random_args(args: argparse.Namespace) -> Any:
    """The random-weight model of ``--dim`` and ``--layers`` (8 heads, a vocabulary of 512)."""
    from torch_tensorrt_dist.models.llama_args import ModelArgs

    return ModelArgs(
        dim=args.dim,
        n_layers=args.layers,
        n_heads=8,
        n_kv_heads=8,
        vocab_size=512,
        intermediate_size=4 * args.dim,
        max_seq_len=256,
    )


def _llama(mesh: Any, args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    """The decode step (``--batch`` rows, each at its own position over its own KV blocks of a
    64-token cache) of the Llama TP plan, or with ``--graph prefill`` the prefill of one
    ``--seq``-token chunk."""
    from torch_tensorrt_dist.generation import runner
    from torch_tensorrt_dist.parallel.llama_load import random_llama

    model = random_llama(
        _llama_args(args), group=mesh.get_group(), lm_head=args.lm_head, embedding=args.embedding
    )
    runner.setup_example(model, args.batch, 64)
    if getattr(args, "graph", "decode") == "prefill":
        if not 2 <= args.seq <= 64:
            raise ConfigError(f"--seq {args.seq}: a prefill chunk must be in [2, 64]")
        return runner.paged_step(model), runner.prefill_example(args.seq)
    return runner.paged_step(model), runner.decode_example(args.batch)


_MOE_HELP = "MoE decode step at --ep x --tp (a --checkpoint's config, or 8 experts, top 2)"

#: name -> (description, builder(tp_mesh, args) -> (model, example inputs))
BUILTIN_MODELS: dict[str, tuple[str, Callable[[Any, argparse.Namespace], Any]]] = {
    "mlp": ("DTensor column/row-parallel MLP (1 all_reduce)", _mlp),
    "block": ("DTensor attention + MLP block, torchtitan plan (2 all_reduces)", _block),
    "llama": ("decode step of the Llama TP plan (2 all_reduces per layer; --pp for 2-D)", _llama),
    "mlp-sp": ("sequence-parallel norm + MLP block (all_gather + reduce_scatter)", _mlp_sp),
    "funcol-mlp": ("hand-sharded MLP with a functional all_reduce", _funcol_mlp),
    "all-to-all": ("row <-> column re-sharding through all_to_all", _all_to_all),
}


def register(sub: Any) -> None:
    models = "; ".join(f"{k}: {v[0]}" for k, v in BUILTIN_MODELS.items())
    models += f"; moe: {_MOE_HELP}"
    summary = "show graphs, graph breaks and collectives of a sharded model (fake process group)"
    p = add_command(sub, "explain", summary, __doc__)
    p.add_argument("--model", default="mlp", choices=sorted([*BUILTIN_MODELS, "moe"]), help=models)
    p.add_argument("--world-size", type=int, default=2, help="ranks in the job (default 2)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default: all)")
    p.add_argument("--dp", type=int, default=None, help="data-parallel degree (default: W/tp)")
    p.add_argument("--rank", type=int, default=0, help="which rank to explain (default 0)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (llama only)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel degree (moe only)")
    p.add_argument("--dim", type=int, default=64, help="model width (1..16384)")
    p.add_argument("--layers", type=int, default=4, help="decoder layers (llama)")
    p.add_argument(
        "--checkpoint", default=None, help="HF checkpoint dir whose config to use (llama)"
    )
    for part in ("lm-head", "embedding"):
        p.add_argument(
            f"--{part}",
            choices=("vocab_parallel", "replicated"),
            default="vocab_parallel",
            help=f"llama: the {part.replace('-', ' ')}'s TP sharding (default vocab_parallel)",
        )
    p.add_argument("--batch", type=int, default=2)
    p.add_argument(
        "--seq",
        type=int,
        default=16,
        help="sequence length (mlp-sp; llama --graph prefill: the bucket; "
        "moe: prefill tokens, 0: none)",
    )
    p.add_argument(
        "--graph",
        choices=("decode", "prefill"),
        default="decode",
        help="llama: the serving graph to explain (default decode)",
    )
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--collective-impl",
        choices=("auto", "native", "plugin", "torch_nccl"),
        default=None,
        help="the TensorRT collective implementation to report on (default: "
        "$TORCH_TENSORRT_DIST_COLLECTIVE_IMPL, else auto)",
    )
    p.set_defaults(func=run)


def impl_summary(collectives: list[Any], requested: str, choice: Any) -> str:
    """One line: which implementation the converters would use and how many collectives it
    takes (``choice``: ``choice.current_impl()`` in this process)."""
    impl = requested if requested != "auto" else choice.impl
    if impl is None:
        return f"TensorRT collectives (collective_impl={requested}): none usable: {choice.reason}"
    takes = sum(1 for c in collectives if c.tensorrt.get(impl) is None)
    here = "usable here" if choice.impl == impl else f"not usable here: {choice.reason}"
    return (
        f"TensorRT collectives (collective_impl={requested}): {impl} layers for {takes} of "
        f"{len(collectives)} collectives ({here})"
    )


def _summary(collectives: list[Any], setting: str | None) -> str:
    from torch_tensorrt_dist.conversion.choice import current_impl, requested_impl
    from torch_tensorrt_dist.conversion.settings import collective_settings

    requested = requested_impl(setting)
    groups = {c.group_ranks for c in collectives if len(c.group_ranks) > 1}
    with collective_settings(requested):
        choice = current_impl(native_takes_all=len(groups) <= 1)
    return impl_summary(collectives, requested, choice)


#: the options' ranges: --dim up to the widest public models' hidden size (16384); the model
#: is built with real (random) weights in this process, so sizes stay near real ones
_LIMITS = {"world_size": 65536, "dim": 16384, "layers": 1024, "batch": 4096, "seq": 65536}


def _check_args(args: argparse.Namespace) -> None:
    """Every count >= 1 and in range; a degree of 0 is refused, not read as "all"."""
    for name, high in _LIMITS.items():
        check_int(getattr(args, name), name=f"--{name.replace('_', '-')}", low=1, high=high)
    for name in ("tp", "dp", "ep", "pp"):
        value = getattr(args, name)
        if value is not None:
            check_int(value, name=f"--{name}", low=1, high=args.world_size)


def run(args: argparse.Namespace) -> int:
    from torch_tensorrt_dist.backend.explain import explain
    from torch_tensorrt_dist.backend.fake_world import fake_world
    from torch_tensorrt_dist.parallel.mesh import make_mesh

    _check_args(args)
    if args.model == "moe":
        return _run_moe(args)
    if args.ep is not None:
        raise ConfigError(f"--ep needs --model moe (got --model {args.model})")
    if args.pp > 1:
        return _run_pipeline(args)
    tp = args.tp or args.world_size
    if args.dim % tp:
        raise ConfigError(f"--dim {args.dim} must be divisible by --tp {tp}")
    _, build = BUILTIN_MODELS[args.model]
    with fake_world(args.rank, args.world_size):
        mesh = make_mesh(tp=tp, dp=args.dp)
        torch.manual_seed(0)
        model, inputs = build(mesh["tp"], args)
        dtype = _DTYPES[args.dtype]
        if isinstance(model, torch.nn.Module):
            model = model.to(dtype)
        inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
        report = explain(model, *inputs)
    if args.json:
        print(report.to_json())
    else:
        print(report)
        print(_summary(report.collectives, args.collective_impl))
    return 0


def _run_pipeline(args: argparse.Namespace) -> int:
    from torch_tensorrt_dist.generation.pipeline_explain import explain_pipeline

    if args.model != "llama":
        raise ConfigError(f"--pp needs --model llama (got --model {args.model})")
    tp = args.tp or args.world_size // args.pp
    if args.pp * tp != args.world_size:
        raise ConfigError(
            f"--pp {args.pp} x --tp {tp} = {args.pp * tp} ranks does not match --world-size "
            f"{args.world_size}"
        )
    report = explain_pipeline(_llama_args(args), pp=args.pp, tp=tp, **_rank_options(args))
    print(json.dumps(report.as_dict(), indent=2) if args.json else report)
    return 0


def _rank_options(args: argparse.Namespace) -> dict[str, Any]:
    """The explained rank, its batch, dtype and vocabulary layout (every explain of a model)."""
    return {
        "rank": args.rank,
        "batch": args.batch,
        "dtype": _DTYPES[args.dtype],
        "lm_head": args.lm_head,
        "embedding": args.embedding,
    }


def _run_moe(args: argparse.Namespace) -> int:
    from torch_tensorrt_dist.generation.moe_explain import explain_moe
    from torch_tensorrt_dist.models.moe_args import MoEArgs

    if args.pp > 1:
        raise ConfigError("--model moe with --pp is not supported yet; use --ep and --tp")
    ep = 1 if args.ep is None else args.ep
    tp = args.tp or args.world_size // ep
    if ep * tp != args.world_size:
        raise ConfigError(
            f"--ep {ep} x --tp {tp} = {ep * tp} ranks does not match --world-size {args.world_size}"
        )
    if args.checkpoint:
        from torch_tensorrt_dist.models.moe_args import read_moe_config
        from torch_tensorrt_dist.models.weights_check import moe_tensors

        margs, moe = read_moe_config(args.checkpoint)
        check_fits(moe_tensors(margs, moe, ()), args.checkpoint)  # per-expert layout: same count
    else:
        margs = _random_args(args)
        moe = MoEArgs(8, 2, 4 * args.dim, sparse_layers=tuple(range(args.layers)))
    report = explain_moe(margs, moe, ep=ep, tp=tp, prefill=args.seq, **_rank_options(args))
    print(json.dumps(report.as_dict(), indent=2) if args.json else report)
    return 0
