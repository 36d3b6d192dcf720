"""``torchtrt-dist compile``: build per-rank compiled artifacts once, for many fast starts.

    torchtrt-dist compile --model PATH --tp 2 --kv-cache-memory 1GiB --out DIR   # 2 ranks
    torchtrt-dist generate --artifacts DIR --prompt "Hello"      # no checkpoint, no compile

Each rank exports its sharded paged step (one graph for every call: rows, prompt chunk and
block table are dynamic up to --max-batch-size, --max-prefill-tokens and --max-seq-len),
compiles it with AOTInductor, and writes it with its weight shard under ``DIR/rank-R/``; the
KV block pool (--kv-cache-memory per rank, --block-size tokens a block) is part of the graph.
Rank 0 writes ``DIR/manifest.json`` last (see docs/artifacts.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
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

__all__ = ["parse_size", "register"]

_UNITS = {"": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(value: str) -> int:
    """``--kv-cache-memory``: bytes, or a number with KiB / MiB / GiB / TiB (``1.5GiB``)."""
    match = _SIZE.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give a size in bytes, or with KiB, MiB, GiB or TiB (e.g. 2GiB, 512MiB)"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a size of at least 1 byte")
    return size


def register(subparsers: Any) -> None:
    from torch_tensorrt_dist.cli.generate import DTYPES
    from torch_tensorrt_dist.generation.generate import (
        DEFAULT_BLOCK_SIZE,
        DEFAULT_MAX_PREFILL_TOKENS,
    )

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
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="longest sequence, prompt and new tokens (default 256, at most the model's)",
    )
    p.add_argument(
        "--max-batch-size",
        "--max-batch",
        dest="max_batch_size",
        type=int,
        default=8,
        help="rows one step runs (default 8, as serve)",
    )
    p.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="KV cache per rank, e.g. 2GiB: the block pool, fixed in the graphs (default: "
        "--max-batch-size sequences of --max-seq-len tokens)",
    )
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="tokens per KV block")
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=DEFAULT_MAX_PREFILL_TOKENS,
        help=f"prompt tokens computed per step (default {DEFAULT_MAX_PREFILL_TOKENS})",
    )
    # removed with the paged step (one graph takes any prompt chunk): refused with the reason
    p.add_argument("--buckets", default=None, help=argparse.SUPPRESS)
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
        max_batch_size=ns.max_batch_size,
        kv_cache_memory=ns.kv_cache_memory,
        block_size=ns.block_size,
        max_prefill_tokens=ns.max_prefill_tokens,
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


def _check_model(ns: argparse.Namespace, path: Any, preset: str | None) -> None:
    """--quantize against the model, and the KV pool the options make (one sequence of
    --max-seq-len tokens at least)."""
    from torch_tensorrt_dist.artifacts.build import (
        cache_len_for,
        check_artifact_quantization,
        check_pool,
    )
    from torch_tensorrt_dist.cli._quantize import check_quantize
    from torch_tensorrt_dist.cli.generate import DTYPES
    from torch_tensorrt_dist.models.llama import ModelArgs
    from torch_tensorrt_dist.models.loader import read_config

    args = read_config(path) if path is not None else ModelArgs.from_name(preset or "tiny")
    check_artifact_quantization(check_quantize(ns, args, tp=ns.tp))
    check_pool(
        args,
        tp=ns.tp,
        dtype=DTYPES[ns.dtype],
        block_size=ns.block_size,
        kv_cache_memory=ns.kv_cache_memory,
        max_batch_size=ns.max_batch_size,
        cache_len=cache_len_for(args, ns.max_seq_len),
    )


def run(ns: argparse.Namespace) -> int:
    from torch_tensorrt_dist.runtime import is_launched, launch

    launched = is_launched(os.environ)
    if ns.tp is None:
        ns.tp = world_size() if launched else 1
    try:
        with alike_on_every_rank():  # the options: alike on every rank
            if ns.tp < 1:
                raise ConfigError(f"--tp must be >= 1, got {ns.tp}")
            if ns.buckets is not None:
                raise ConfigError(
                    "--buckets: artifacts no longer hold a prefill graph per bucket; one step "
                    "graph takes any prompt chunk up to --max-prefill-tokens tokens: drop --buckets"
                )
            check_int(ns.max_batch_size, name="--max-batch-size", low=1)
            check_int(ns.block_size, name="--block-size", low=1)
            check_int(ns.max_prefill_tokens, name="--max-prefill-tokens", low=1)
            if ns.max_seq_len is not None:  # 0 is refused, not read as "the default"
                check_int(ns.max_seq_len, name="--max-seq-len", low=2)
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

            # a wrong --model, --out, --quantize or --kv-cache-memory fails here, before any
            # rank starts
            path, preset = resolve_model(ns.model)
            _check_model(ns, path, preset)
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
