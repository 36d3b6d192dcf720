"""``torchtrt-dist compile``: build per-rank compiled artifacts once, for many fast starts.

    torchtrt-dist compile --model PATH --tp 2 --out DIR          # starts its own 2 ranks
    torchtrt-dist generate --artifacts DIR --prompt "Hello"      # no checkpoint, no compile

Each rank exports its sharded prefill step (one graph per bucket) and decode step, compiles
them with AOTInductor, and writes them with its weight shard under ``DIR/rank-R/``; rank 0
writes ``DIR/manifest.json`` last (see docs/artifacts.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from torch_tensorrt_dist.cli._options import (
    absent,
    add_engine,
    add_layout,
    add_model,
    add_quantize,
    add_threads,
)
from torch_tensorrt_dist.cli._rank import start
from torch_tensorrt_dist.config.jobs import CompileJob
from torch_tensorrt_dist.validation import check_int

__all__ = ["register", "run"]


def _buckets(value: str) -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give comma-separated lengths") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give lengths >= 1")
    return out


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compile",
        help="compile per-rank artifacts (graphs + weight shard + manifest) for generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model(p)
    add_layout(p, pp="pipeline stages (only 1 so far)", ep=False)
    add_engine(p, choices=("inductor", "tensorrt"), default="inductor", verify=False)
    p.add_argument("--max-seq-len", type=int, default=None, help="KV cache length (default 256)")
    p.add_argument(
        "--max-batch",
        dest="max_batch_size",
        type=int,
        default=1,
        help="rows per request (default 1)",
    )
    p.add_argument(
        "--buckets",
        type=_buckets,
        default=None,
        help="prefill lengths, comma-separated (default 16,32,.. up to half the length)",
    )
    add_quantize(p)
    add_threads(p)
    p.add_argument("--out", required=True, help="artifact directory to write")
    p.add_argument("--json", action="store_true", help="print one JSON object on rank 0")
    absent(p, "kv_cache_memory", "block_size", "max_prefill_tokens", "prefix_caching")
    p.set_defaults(func=run)


def _job(ns: argparse.Namespace) -> CompileJob:
    check_int(ns.max_batch_size, name="--max-batch", low=1)
    return CompileJob(ns.out, None if ns.buckets is None else tuple(ns.buckets), ns.json)


def run(ns: argparse.Namespace) -> int:
    return start(ns, _job)
