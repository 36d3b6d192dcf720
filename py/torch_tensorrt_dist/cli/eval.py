"""``torchtrt-dist eval --perplexity FILE``: perplexity of a sharded (optionally quantized) model.

    torchtrt-dist eval --perplexity heldout.txt --tp 2 --quantize int8
    torchtrt-dist eval --perplexity demo                 # the demo model's held-out text

The same ranks, layout and engines as ``generate`` (``--tp``, ``--ep``, ``--engine``,
``--dtype``, ``--quantize``). The file's paragraphs (blank-line separated) become documents
``<s> text </s>``; sliding windows of ``--window`` tokens advance by ``--stride``, and each
token after the first is scored once (``generation/perplexity.py``). ``demo`` names the held-out
text shipped with the demo model (``data/demo/heldout.txt``, see ``models/demo_heldout.py``).
Rank 0 prints the perplexity (one JSON object with ``--json``).
"""

from __future__ import annotations

import argparse
from typing import Any

from torch_tensorrt_dist.cli import _options as opt
from torch_tensorrt_dist.cli._eval_job import EvalRankJob
from torch_tensorrt_dist.cli._rank import start
from torch_tensorrt_dist.config.jobs import EvalJob

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = opt.add_command(
        subparsers, "eval", "perplexity of a (sharded, quantized) model over a text file", __doc__
    )
    p.add_argument(
        "--perplexity",
        required=True,
        metavar="FILE",
        help="text file (paragraphs separated by blank lines), or 'demo' for the demo model's "
        "held-out text",
    )
    opt.add_model(p)
    opt.add_layout(p, pp=None, ep=True)
    opt.add_engine(p, default="none", verify=False)
    p.add_argument("--window", type=int, default=256, help="tokens per window (default 256)")
    p.add_argument("--stride", type=int, default=128, help="tokens a window advances (default 128)")
    opt.add_kv_cache(p, max_seq_len=None)
    opt.add_quantize(p)
    opt.add_threads(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on rank 0")
    p.set_defaults(func=run)


def _job(ns: argparse.Namespace) -> EvalJob:
    return EvalJob(ns.perplexity, ns.window, ns.stride, ns.json)


def run(ns: argparse.Namespace) -> int:
    return start(ns, _job, EvalRankJob())
