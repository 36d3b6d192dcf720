"""Functions the multi-rank tests run in spawned gloo ranks (must be importable)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import torch_tensorrt_dist  # noqa: F401  (registers ops and backend)
from torch_tensorrt_dist.models.toy import MLP, Block, NormMLP
from torch_tensorrt_dist.parallel import make_mesh
from torch_tensorrt_dist.parallel.plans import (
    FunctionalTPMLP,
    ShardSwap,
    sequence_parallel_block,
    tensor_parallel_block,
    tensor_parallel_mlp,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _compile(fn: Any, engine: str) -> Any:
    torch._dynamo.reset()
    return torch.compile(
        fn, backend="torch_tensorrt_dist", options={"engine": engine}, fullgraph=True
    )


def compiled_vs_unsharded(
    rank: int, world: int, model: str, engine: str, tp: int, dtype: str
) -> dict[str, Any]:
    """Compile a sharded toy model on the (dp, tp) mesh; compare with the unsharded model."""
    dt = DTYPES[dtype]
    mesh = make_mesh(tp=tp)
    tp_mesh = mesh["tp"]
    torch.manual_seed(0)  # same weights and inputs on every rank
    dim = 32
    if model == "mlp-sp":
        full: torch.nn.Module = NormMLP(dim, 4 * dim)
    elif model == "block":
        full = Block(dim, n_heads=4)
    else:
        full = MLP(dim, 4 * dim)
    full = full.to(dt)
    x = (
        torch.randn(2, 8, dim, dtype=dt)
        if model in ("mlp-sp", "block")
        else torch.randn(8, dim, dtype=dt)
    )
    x = x + mesh.get_local_rank("dp")  # data parallel: each replica gets its own input
    with torch.no_grad():
        ref = full(x) if model != "all-to-all" else None
        import copy

        if model == "mlp":
            sharded: Any = tensor_parallel_mlp(copy.deepcopy(full), tp_mesh)
            local_in, expected = x, ref
        elif model == "block":
            sharded = tensor_parallel_block(copy.deepcopy(full), tp_mesh)
            local_in, expected = x, ref
        elif model == "funcol-mlp":
            sharded = FunctionalTPMLP(full, tp_mesh).to(dt)
            local_in, expected = x, ref
        elif model == "mlp-sp":
            sharded = sequence_parallel_block(copy.deepcopy(full), tp_mesh)
            s = x.shape[1] // tp
            r = tp_mesh.get_local_rank()
            local_in, expected = x[:, r * s : (r + 1) * s], ref[:, r * s : (r + 1) * s]
        elif model == "all-to-all":
            sharded = ShardSwap(tp_mesh, dim).to(dt)
            rows = x.shape[0] // tp
            r = tp_mesh.get_local_rank()
            local_in = x[r * rows : (r + 1) * rows]
            expected = local_in * sharded.scale
        else:
            raise ValueError(model)
        compiled = _compile(lambda t: sharded(t), engine)
        from torch_tensorrt_dist.backend import recording

        with recording() as graphs:
            out = compiled(local_in)
    return {
        "max_err": (out.float() - expected.float()).abs().max().item(),
        "graphs": len(graphs),
        "collectives": [(c.op, list(c.group_ranks)) for g in graphs for c in g.collectives],
        "tp_ranks": dist.get_process_group_ranks(tp_mesh.get_group()),
    }


def compiled_cases(rank: int, world: int, cases: list[tuple[str, str, int, str]]) -> list[Any]:
    """Run several ``compiled_vs_unsharded`` cases in one spawn (process start-up is slow)."""
    return [compiled_vs_unsharded(rank, world, *case) for case in cases]
