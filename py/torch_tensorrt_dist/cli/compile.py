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
from typing import Any

from torch_tensorrt_dist.cli import _options as opt
from torch_tensorrt_dist.cli._compile_job import CompileRankJob
from torch_tensorrt_dist.cli._rank import start
from torch_tensorrt_dist.config.jobs import CompileJob
from torch_tensorrt_dist.errors import ConfigError

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    summary = "compile per-rank artifacts (graphs + weight shard + manifest) for generate"
    p = opt.add_command(subparsers, "compile", summary, __doc__)
    opt.add_model(p)
    opt.add_layout(p, pp="pipeline stages (only 1 so far)", ep=False)
    opt.add_engine(p, choices=("inductor", "tensorrt"), default="inductor", verify=False)
    opt.add_kv_cache(
        p,
        max_batch_size="rows computed together (default 8)",
        max_seq_len="the longest request: prompt + generated tokens (default 256, at most the "
        "model's positions)",
        prefix_caching=False,
    )
    p.add_argument("--max-batch", dest="max_batch_size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--buckets", default=None, help=argparse.SUPPRESS)  # refused: see _job
    opt.add_quantize(p)
    opt.add_threads(p)
    p.add_argument("--out", required=True, help="artifact directory to write")
    p.add_argument("--json", action="store_true", help="print one JSON object on rank 0")
    opt.absent(p, "prefix_caching")
    p.set_defaults(func=run)


def _job(ns: argparse.Namespace) -> CompileJob:
    if ns.buckets is not None:
        raise ConfigError(
            "--buckets: artifacts no longer hold a prefill graph per bucket; one step graph "
            "takes any prompt chunk up to --max-prefill-tokens tokens: drop --buckets"
        )
    return CompileJob(ns.out, ns.json)


def run(ns: argparse.Namespace) -> int:
    return start(ns, _job, CompileRankJob())
