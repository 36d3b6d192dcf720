"""A tensor-parallel MLP compiled into one graph (one engine) per rank.

    torchrun --nproc-per-node 2 examples/distributed_inference/tensor_parallel_simple.py \\
        --engine inductor

w1 is column-parallel and w2 row-parallel (DTensor ``parallelize_module``), so each rank holds
half of each weight and the forward pass has exactly one all_reduce over the TP group. The
program compiles the sharded model with the ``torch_tensorrt_dist`` backend, checks the result
against the unsharded model on every rank, and prints one JSON line on rank 0. It runs on CPU
(gloo) and on GPUs (nccl; ``--engine tensorrt`` needs TensorRT and Torch-TensorRT).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

import torch
import torch.distributed as dist

import torch_tensorrt_dist
from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.models.toy import MLP
from torch_tensorrt_dist.parallel import make_mesh
from torch_tensorrt_dist.parallel.plans import tensor_parallel_mlp

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=("tensorrt", "inductor", "eager"), default="inductor")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = torch_tensorrt_dist.init_distributed()
    dtype = DTYPES[args.dtype]
    device = torch.device(info.device)
    mesh = make_mesh(tp=info.world_size)

    torch.manual_seed(args.seed)  # the same full weights and input on every rank
    full = MLP(args.dim, 4 * args.dim).to(device, dtype)
    x = torch.randn(args.batch, args.dim, device=device, dtype=dtype)
    with torch.no_grad():
        expected = full(x)
        # parallelize_module keeps each rank's shard of the full weights
        sharded = tensor_parallel_mlp(copy.deepcopy(full), mesh["tp"])
        compiled = torch.compile(
            lambda t: sharded(t),
            backend="torch_tensorrt_dist",
            options={"engine": args.engine},
            fullgraph=True,
        )
        with recording() as graphs:
            out = compiled(x)
    err = (out.float() - expected.float()).abs().max().item()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    result = {
        "rank": info.rank,
        "world_size": info.world_size,
        "engine": args.engine,
        "graphs": len(graphs),
        "collectives": [[c.op, list(c.group_ranks)] for g in graphs for c in g.collectives],
        "max_abs_err": err,
        "checksum": round(out.float().sum().item(), 4),
        "ok": err <= tol,
    }
    results: list[dict | None] = [None] * info.world_size
    dist.all_gather_object(results, result)
    if info.rank == 0:
        print(json.dumps({"ok": all(r["ok"] for r in results if r), "ranks": results}))
    dist.destroy_process_group()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
