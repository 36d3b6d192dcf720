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
import json
import os
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.cli._failures import (
    alike_on_every_rank,
    check_world,
    print_launch_failure,
    rank_entry,
    refuse,
)
from torch_tensorrt_dist.cli._quantize import add_quantize_args, check_quantize, quantize_rank
from torch_tensorrt_dist.errors import ConfigError, TensorRTDistError, VerificationError
from torch_tensorrt_dist.quantization.scheme import QuantConfig
from torch_tensorrt_dist.validation import check_int

__all__ = ["register"]


def register(subparsers: Any) -> None:
    from torch_tensorrt_dist.cli.generate import DTYPES

    p = subparsers.add_parser(
        "eval",
        help="perplexity of a (sharded, quantized) model over a text file",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--perplexity",
        required=True,
        metavar="FILE",
        help="text file (paragraphs separated by blank lines), or 'demo' for the demo model's "
        "held-out text",
    )
    p.add_argument("--model", default=None, help="checkpoint directory or preset (default demo)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel ranks (default 1)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (MoE checkpoints)")
    p.add_argument(
        "--engine",
        choices=("tensorrt", "inductor", "eager", "none"),
        default="none",
        help="as for generate (default none: plain PyTorch, nothing to compile)",
    )
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    p.add_argument("--window", type=int, default=256, help="tokens per window (default 256)")
    p.add_argument("--stride", type=int, default=128, help="tokens a window advances (default 128)")
    p.add_argument("--lm-head", choices=("vocab_parallel", "replicated"), default="vocab_parallel")
    p.add_argument(
        "--embedding", choices=("vocab_parallel", "replicated"), default="vocab_parallel"
    )
    add_quantize_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on rank 0")
    p.set_defaults(func=run, pp=1, split=None)


def _text_file(value: str) -> Path:
    if value == "demo":
        from torch_tensorrt_dist.models.demo_heldout import heldout_path

        return heldout_path()
    path = Path(value)
    if not path.is_file():
        raise ConfigError(f"--perplexity {value}: no such file; give a text file, or 'demo'")
    return path


def _read_text(value: str) -> str:
    path = _text_file(value)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--perplexity {value}: cannot read it as UTF-8 text ({exc}); give a text file"
        ) from None


def _plan(ns: argparse.Namespace) -> tuple[Path | None, Any]:
    """Validate everything before any rank starts; return (checkpoint path, model args)."""
    from torch_tensorrt_dist.cli.generate import _resolve_model
    from torch_tensorrt_dist.cli.generate_moe import plan_moe
    from torch_tensorrt_dist.generation.perplexity import windows
    from torch_tensorrt_dist.models.llama import ModelArgs
    from torch_tensorrt_dist.models.llama_args import read_config
    from torch_tensorrt_dist.parallel.llama import tp_layout

    for option in ("tp", "ep", "stride"):
        check_int(getattr(ns, option), name=f"--{option}", low=1)
    check_int(ns.window, name="--window", low=2)
    _read_text(ns.perplexity)
    windows(2, ns.window, ns.stride)  # stride <= window
    path, preset = _resolve_model(ns.model)
    moe = plan_moe(ns, path)
    if moe is not None:
        args = moe[0]
    else:
        args = read_config(path) if path is not None else ModelArgs.from_name(preset or "tiny")
    if ns.window > args.max_seq_len:
        raise ConfigError(
            f"--window {ns.window} exceeds the model's {args.max_seq_len} positions; use at most "
            "that many"
        )
    tp_layout(args, 0, ns.tp, ns.lm_head, ns.embedding)
    check_quantize(ns, args, tp=ns.tp, expert_size=None if moe is None else moe[1].expert_size)
    return path, args


def _load(
    ns: argparse.Namespace, path: Path | None, args: Any, world: int, group: Any, device: Any
) -> tuple[Any, QuantConfig | None]:
    """This rank's shard (dense or MoE, checkpoint or preset), quantized when asked."""
    from torch_tensorrt_dist.cli.generate import DTYPES
    from torch_tensorrt_dist.cli.generate_moe import load_moe_rank, plan_moe
    from torch_tensorrt_dist.parallel.llama_load import load_llama, random_llama

    dtype = DTYPES[ns.dtype]
    if path is not None and plan_moe(ns, path) is not None:
        model = load_moe_rank(
            ns, path, world=world, dtype=dtype, device=device, max_seq_len=args.max_seq_len
        )
    elif path is not None:
        model = load_llama(
            path,
            group=group,
            dtype=dtype,
            device=device,
            lm_head=ns.lm_head,
            embedding=ns.embedding,
            max_seq_len=args.max_seq_len,
            progress=False,
        )
    else:
        model = random_llama(
            args, seed=0, group=group, dtype=dtype, lm_head=ns.lm_head, embedding=ns.embedding
        ).to(device)
    return model, quantize_rank(model, ns, engine=ns.engine)


def _rank_main(ns: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from torch_tensorrt_dist.generation.perplexity import document_ids, perplexity
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer
    from torch_tensorrt_dist.runtime import init_distributed
    from torch_tensorrt_dist.runtime.agree import agreed

    world = check_world({"ep": ns.ep, "tp": ns.tp})
    path, args = _plan(ns)
    device: Any = "cuda" if torch.cuda.is_available() else "cpu"
    group, rank = None, 0
    if world > 1:
        info = init_distributed()
        group, rank, device = dist.group.WORLD, info.rank, info.device
    # every rank loads and quantizes its shard; none runs a window (collectives) until all have
    with agreed("loading the checkpoint"):
        model, quant = _load(ns, path, args, world, group, device)
    tok = load_tokenizer(path, vocab_size=args.vocab_size)
    ids = document_ids(_read_text(ns.perplexity), tok)
    result = perplexity(model, ids, window=ns.window, stride=ns.stride, engine=ns.engine)
    if rank == 0:
        summary = {
            "perplexity": result.perplexity,
            "nll": result.nll,
            "tokens": result.tokens,
            "windows": result.windows,
            "seconds": result.seconds,
            "file": ns.perplexity,
            "tp": ns.tp,
            "ep": ns.ep,
            "engine": ns.engine,
            "dtype": ns.dtype,
            "quantize": None if quant is None else quant.to_dict(),
        }
        if ns.json:
            print(json.dumps(summary), flush=True)
        else:
            q = "" if quant is None else f" {quant.describe()}"
            print(
                f"perplexity {result.perplexity:.4f} over {result.tokens} tokens "
                f"({result.windows} windows of {ns.window}, stride {ns.stride}) "
                f"[tp={ns.tp} engine={ns.engine} {ns.dtype}{q}] {result.seconds:.1f} s",
                flush=True,
            )
    if world > 1:
        dist.destroy_process_group()
    return 0


def run(ns: argparse.Namespace) -> int:
    from torch_tensorrt_dist.runtime import is_launched, launch

    launched = is_launched(os.environ)
    if ns.tp is None:
        ns.tp = max(1, int(os.environ.get("WORLD_SIZE", "1")) // ns.ep) if launched else 1
    try:
        with alike_on_every_rank():
            _plan(ns)  # bad input fails here, before any rank starts
        if ns.tp * ns.ep == 1 or launched:
            return _rank_main(ns)
    except VerificationError as exc:
        return refuse(exc, 1)
    except TensorRTDistError as exc:
        return refuse(exc, 2)
    ns.func = None
    result = launch(rank_entry, ns.tp * ns.ep, [_rank_main, ns])
    print_launch_failure(result, verbose=getattr(ns, "verbose", 0))
    return int(result.returncode)
