"""``torchtrt-dist compile``: build per-rank compiled artifacts once, for many fast starts.

    torchtrt-dist compile --model PATH --tp 2 --out DIR          # starts its own 2 ranks
    torchtrt-dist generate --artifacts DIR --prompt "Hello"      # no checkpoint, no compile

Each rank exports its sharded prefill step (one graph per bucket) and decode step, compiles
them with AOTInductor, and writes them with its weight shard under ``DIR/rank-R/``; rank 0
writes ``DIR/manifest.json`` last (see docs/artifacts.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any

from torch_tensorrt_dist.cli._failures import (
    alike_on_every_rank,
    print_launch_failure,
    rank_entry,
    refuse,
    world_size,
)
from torch_tensorrt_dist.cli._quantize import add_quantize_args, requested
from torch_tensorrt_dist.errors import ConfigError, TensorRTDistError
from torch_tensorrt_dist.validation import check_int

__all__ = ["register"]


def _buckets(value: str) -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give comma-separated lengths") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give lengths >= 1")
    return out


def register(subparsers: Any) -> None:
    from torch_tensorrt_dist.cli.generate import DTYPES

    p = subparsers.add_parser(
        "compile",
        help="compile per-rank artifacts (graphs + weight shard + manifest) for generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default=None, help="checkpoint directory or preset (default demo)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel ranks (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (only 1 so far)")
    p.add_argument("--engine", choices=("inductor", "tensorrt"), default="inductor")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    p.add_argument("--max-seq-len", type=int, default=None, help="KV cache length (default 256)")
    p.add_argument("--max-batch", type=int, default=1, help="rows per request (default 1)")
    p.add_argument(
        "--buckets",
        type=_buckets,
        default=None,
        help="prefill lengths, comma-separated (default 16,32,.. up to half the length)",
    )
    p.add_argument("--lm-head", choices=("vocab_parallel", "replicated"), default="vocab_parallel")
    p.add_argument(
        "--embedding", choices=("vocab_parallel", "replicated"), default="vocab_parallel"
    )
    add_quantize_args(p)
    p.add_argument("--out", required=True, help="artifact directory to write")
    p.add_argument("--json", action="store_true", help="print one JSON object on rank 0")
    p.set_defaults(func=run)


def _rank_main(ns: argparse.Namespace) -> int:
    import torch

    from torch_tensorrt_dist.artifacts import compile_artifacts
    from torch_tensorrt_dist.cli.generate import DTYPES
    from torch_tensorrt_dist.runtime import init_distributed

    if not torch.cuda.is_available():  # Inductor's import warns about CUDA_HOME: not our case
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    world = world_size()
    if world != ns.tp * ns.pp:
        raise ConfigError(
            f"--tp {ns.tp} needs {ns.tp * ns.pp} ranks, but the launcher started {world}"
        )
    if world > 1:
        init_distributed()
    result = compile_artifacts(
        ns.model,
        ns.out,
        engine=ns.engine,
        dtype=DTYPES[ns.dtype],
        max_seq_len=ns.max_seq_len,
        max_batch_size=ns.max_batch,
        buckets=ns.buckets,
        lm_head=ns.lm_head,
        embedding=ns.embedding,
        pp=ns.pp,
        quantize=requested(ns),
    )
    if int(os.environ.get("RANK", "0")) == 0:
        summary = {"manifest": str(result.manifest), "compile_s": result.seconds, "tp": ns.tp}
        if ns.json:
            print(json.dumps(summary), flush=True)
        else:
            print(f"wrote {result.manifest} (tp={ns.tp}, {result.seconds:.1f} s)", flush=True)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


def _check_quantize(ns: argparse.Namespace, path: Any, preset: str | None) -> None:
    from torch_tensorrt_dist.artifacts.build import check_artifact_quantization
    from torch_tensorrt_dist.cli._quantize import check_quantize
    from torch_tensorrt_dist.models.llama import ModelArgs
    from torch_tensorrt_dist.models.llama_args import read_config

    args = read_config(path) if path is not None else ModelArgs.from_name(preset or "tiny")
    check_artifact_quantization(check_quantize(ns, args, tp=ns.tp))


def run(ns: argparse.Namespace) -> int:
    from torch_tensorrt_dist.runtime import is_launched, launch

    launched = is_launched(os.environ)
    if ns.tp is None:
        ns.tp = world_size() if launched else 1
    try:
        with alike_on_every_rank():  # the options: alike on every rank
            if ns.tp < 1:
                raise ConfigError(f"--tp must be >= 1, got {ns.tp}")
            check_int(ns.max_batch, name="--max-batch", low=1)
            if ns.max_seq_len is not None:  # 0 is refused, not read as "the default"
                check_int(ns.max_seq_len, name="--max-seq-len", low=1)
            if ns.pp != 1:
                raise ConfigError(
                    f"--pp {ns.pp}: pipeline artifacts are not supported yet; compile with --tp "
                    "only, or run `torchtrt-dist generate --pp` from the checkpoint"
                )
            if ns.engine != "inductor":
                raise ConfigError(
                    "--engine tensorrt: TensorRT artifacts are not built yet (a TensorRT engine "
                    "freezes the KV-cache buffers; they must become engine inputs first); use "
                    "--engine inductor"
                )
            from torch_tensorrt_dist.artifacts.build import check_output_dir, resolve_model

            # a wrong --model, --out or --quantize fails here, before any rank starts
            path, preset = resolve_model(ns.model)
            _check_quantize(ns, path, preset)
        if not launched:
            check_output_dir(ns.out)
        if ns.tp == 1 or launched:
            return _rank_main(ns)
    except TensorRTDistError as exc:
        return refuse(exc, 2)
    ns.func = None
    result = launch(rank_entry, ns.tp, [_rank_main, ns])
    print_launch_failure(result, verbose=getattr(ns, "verbose", 0))
    return int(result.returncode)
