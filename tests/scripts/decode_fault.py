"""Test program: tensor-parallel decode in which one rank dies mid-way.

    torchtrt-dist run --nproc-per-node 2 tests/scripts/decode_fault.py --die-rank 1 --die-step 3 \\
        --death-file /tmp/death

Both ranks compile prefill and decode (eager engine) for a tiny random Llama at TP 2; rank
``--die-rank`` SIGKILLs itself after decode step ``--die-step`` (writing its time of death
first), while the other rank waits in the next step's all_reduce.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.parallel.llama_load import random_llama
from torch_tensorrt_dist.runtime import init_distributed


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--die-rank", type=int, required=True)
    p.add_argument("--die-step", type=int, default=3)
    p.add_argument("--death-file", required=True)
    args = p.parse_args()
    info = init_distributed()
    model_args = ModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=128,
        intermediate_size=128,
        max_seq_len=64,
    )
    model = random_llama(model_args, group=dist.group.WORLD)
    gen = Generator(model, engine="eager", max_batch_size=1, cache_len=64)
    steps = 0

    def on_step(_: list[int]) -> None:
        nonlocal steps
        steps += 1
        if info.rank == args.die_rank and steps == args.die_step:
            with open(args.death_file, "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    with torch.no_grad():
        gen.generate([[1, 2, 3]], max_new_tokens=20, on_step=on_step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
