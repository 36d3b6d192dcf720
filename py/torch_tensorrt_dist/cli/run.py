"""``torchtrt-dist run``: start the ranks of a program with torchrun or mpirun.

    torchtrt-dist run --nproc-per-node 2 app.py --flag            # torchrun (native NCCL path)
    torchtrt-dist run --launcher mpi --nproc-per-node 2 app.py     # mpirun (TensorRT-LLM plugins)

When a rank fails the others are stopped; stderr shows that rank's error in one line (``-v``:
its traceback) and a line naming the rank, and the command exits with that rank's status.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def _nproc(value: str) -> int:
    if value in ("auto", "gpu"):
        import torch

        return max(torch.cuda.device_count(), 1)
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give a number, 'auto' or 'gpu'") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: need at least 1 process per node")
    return n


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1..65535)")
    return port


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="start N ranks of a program (torchrun or mpirun)",
        description=(
            "Start the ranks of a program. torchrun (default) suits the native TensorRT "
            "DistCollective path; --launcher mpi starts an MPI world, which the TensorRT-LLM "
            "NCCL plugins need. Every rank gets torch's NCCL library on LD_LIBRARY_PATH."
        ),
    )
    p.add_argument("--launcher", choices=("torchrun", "mpi"), default="torchrun")
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=_nproc,
        default=None,
        metavar="N",
        help="ranks per node (default: the number of GPUs, or 1 without GPUs)",
    )
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="torchrun: this node")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", help="torchrun: HOST:PORT to meet at")
    p.add_argument("--rdzv-backend", "--rdzv_backend", help="torchrun: c10d (default) or static")
    p.add_argument("--master-addr", "--master_addr", help="address of rank 0 (static / mpi)")
    p.add_argument("--master-port", "--master_port", type=_port, help="port on rank 0's host")
    p.add_argument("--hostfile", help="mpi: Open MPI hostfile (`host slots=N` per line)")
    p.add_argument("--bind-to", default="none", help="mpi: mpirun --bind-to (default none)")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="collective timeout for every rank (sets TORCH_TENSORRT_DIST_TIMEOUT)",
    )
    p.add_argument(
        "--nccl-preload",
        action="store_true",
        help="also put torch's libnccl.so.2 on LD_PRELOAD (programs that load TensorRT first)",
    )
    p.add_argument("-m", "--module", action="store_true", help="run the target as a module")
    p.add_argument("script", help="the program (a .py file, or a module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the program's arguments")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from torch_tensorrt_dist.cli._failures import print_launch_failure
    from torch_tensorrt_dist.errors import TensorRTDistError
    from torch_tensorrt_dist.runtime.launcher import LaunchOptions, launch

    try:
        opts = LaunchOptions(
            nproc_per_node=args.nproc_per_node or _nproc("auto"),
            launcher=args.launcher,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_backend=args.rdzv_backend,
            hostfile=args.hostfile,
            bind_to=args.bind_to,
            nccl_preload=args.nccl_preload,
            timeout=args.timeout,
        )
        result = launch(args.script, opts, args.script_args, module=args.module)
    except (TensorRTDistError, OSError) as exc:
        print(f"torchtrt-dist run: {exc}", file=sys.stderr)
        return 2
    print_launch_failure(result, verbose=getattr(args, "verbose", 0), prefix="")
    return result.returncode
