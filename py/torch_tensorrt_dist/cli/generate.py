"""``torchtrt-dist generate``: tensor-parallel text generation from a HF Llama-family checkpoint.

    torchtrt-dist generate --model PATH --tp 2 --engine inductor --prompt "Hello" --json
    torchtrt-dist generate --pp 2 --tp 2          # 4 ranks: 2 pipeline stages of 2 TP ranks
    torchtrt-dist generate --model MIXTRAL --ep 2 --tp 2   # MoE: experts over 2 EP ranks
    torchrun --nproc-per-node 2 -m torch_tensorrt_dist generate --model PATH --prompt "Hello"

Without a launcher (no ``RANK`` in the environment) and ``--tp`` > 1 it starts its own ranks
(torchrun's elastic agent on a free port; when one rank fails the others are stopped, and
that rank's error is printed). Under torchrun or mpirun it uses the environment. Rank 0
streams the text (or prints one JSON object with ``--json``). ``--model`` defaults to the
shipped demo checkpoint, or, where that is absent, to the ``tiny`` preset with deterministic
random weights; a preset name also works.
"""

from __future__ import annotations

import argparse
from typing import Any

from torch_tensorrt_dist.cli import _options as opt
from torch_tensorrt_dist.cli._generate_job import GenerateRankJob
from torch_tensorrt_dist.cli._rank import start
from torch_tensorrt_dist.config.jobs import GenerateJob
from torch_tensorrt_dist.generation.sampling import SamplingConfig

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    summary = "generate text with a tensor-parallel Llama/Mistral/Qwen2 model"
    p = opt.add_command(subparsers, "generate", summary, __doc__)
    opt.add_model(
        p, artifacts="start from `torchtrt-dist compile` artifacts (no checkpoint read, no compile)"
    )
    opt.add_layout(
        p,
        pp="pipeline stages (default 1); the job has pp x tp ranks, TP inner",
        ep=True,
        pipeline=True,
    )
    opt.add_engine(p)
    p.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="prompt text; repeat for a batch (default: one sample prompt)",
    )
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same on every rank)")
    opt.add_kv_cache(
        p,
        max_seq_len="the longest request: prompt + new tokens, the KV cache's length per row "
        "(default: what the prompts and new tokens need)",
    )
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="time the first call too (compilation lands in ttft_s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on rank 0")
    opt.add_quantize(p)
    opt.add_speculative(p)
    opt.add_threads(p)
    p.set_defaults(func=run)


def _job(ns: argparse.Namespace) -> GenerateJob:
    return GenerateJob(
        tuple(ns.prompt or GenerateJob.prompts),
        ns.max_new_tokens,
        SamplingConfig(ns.temperature, ns.top_k, ns.top_p, ns.seed),
        warmup=not ns.no_warmup,
        json=ns.json,
    )


def run(ns: argparse.Namespace) -> int:
    return start(ns, _job, GenerateRankJob())
