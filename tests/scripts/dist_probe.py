"""Test program for the launcher: init_distributed, one all_reduce, a JSON line per rank.

    torchtrt-dist run --nproc-per-node 2 tests/scripts/dist_probe.py [--fail-rank 1 --exit-code 3]

Each rank prints ``{"rank", "world_size", "local_rank", "launcher", "backend", "sum", ...}``
where ``sum`` is the all_reduce of (rank + 1) over the world. ``--fail-rank R`` makes rank R
leave with ``--exit-code`` (``--kill`` : SIGKILL itself; ``--abort``: abort, as glibc does on a
corrupted heap; ``--raise``: an exception) right
after setup while the others block in the all_reduce; it writes its time of death to
``--death-file`` first. ``--sleep-rank R`` makes rank R busy (a 60 s sleep) before the
all_reduce: the launcher stops it, or its peers' all_reduce times out (``run --timeout``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from torch_tensorrt_dist.runtime import init_distributed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--kill", action="store_true")
    parser.add_argument("--abort", action="store_true")
    parser.add_argument("--raise", dest="raise_", action="store_true")
    parser.add_argument("--death-file", default=None)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--sleep-rank", type=int, default=None)
    args = parser.parse_args()

    torch.set_num_threads(1)
    info = init_distributed(backend="gloo", timeout=args.timeout)
    dist.barrier()
    if info.rank == args.fail_rank:
        if args.death_file:
            with open(args.death_file, "w") as fh:
                fh.write(repr(time.time()))
        if args.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.abort:
            os.abort()
        if args.raise_:
            raise ValueError(f"probe failure on rank {info.rank}")
        sys.stdout.flush()
        os._exit(args.exit_code)
    if info.rank == args.sleep_rank:
        time.sleep(60)
    x = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(x)
    record = {
        "rank": info.rank,
        "world_size": info.world_size,
        "local_rank": info.local_rank,
        "launcher": info.launcher,
        "backend": info.backend,
        "sum": x.item(),
        "env_rank": os.environ.get("RANK"),
        "ompi_rank": os.environ.get("OMPI_COMM_WORLD_RANK"),
        "timeout_s": info.timeout.total_seconds() if info.timeout else None,
        "nccl_library": os.environ.get("TORCH_TENSORRT_DIST_NCCL_LIBRARY"),
    }
    # One write per line: under `python -u` print() writes the newline separately, and two
    # ranks' lines could interleave in the launcher's output.
    sys.stdout.write("PROBE " + json.dumps(record) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
