"""``torchtrt-dist generate --artifacts DIR``: generate from compiled artifacts.

The launching process reads the manifest and checks the options and the request against the
compiled limits (rows, sequence length, KV pool) before any rank starts; each rank then checks
layout, versions, groups and its own files (``artifacts.load``) before any collective, loads
its shard and graphs, and generates.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.tokenizer import Tokenizer
from torch_tensorrt_dist.validation import check_text

__all__ = ["RUN_OPTIONS", "plan_artifacts", "rank_main", "run_options"]

#: Options of generate / serve that the artifacts fix at compile (``artifacts.load.check_options``).
RUN_OPTIONS = (
    "max_batch_size",
    "max_seq_len",
    "kv_cache_memory",
    "block_size",
    "max_prefill_tokens",
)


def run_options(ns: argparse.Namespace) -> dict[str, int | None]:
    """The compile-time options this command was given (None: not given, or not an option of
    this command)."""
    return {name: getattr(ns, name, None) for name in RUN_OPTIONS}


def _tokenizer(root: Path, vocab_size: int) -> Tokenizer:
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer

    tok_dir = root / "tokenizer"
    return load_tokenizer(tok_dir if tok_dir.is_dir() else None, vocab_size=vocab_size)


def plan_artifacts(ns: argparse.Namespace) -> list[list[int]]:
    """Check the options against the manifest; set ``ns.tp``; return the encoded prompts."""
    from torch_tensorrt_dist.artifacts.load import check_options, model_args
    from torch_tensorrt_dist.artifacts.manifest import (
        check_layout,
        check_length,
        check_quantization,
        read_manifest,
        verify_files,
    )
    from torch_tensorrt_dist.cli._quantize import requested
    from torch_tensorrt_dist.generation import SamplingConfig
    from torch_tensorrt_dist.runtime import is_launched, plan_from_env

    if ns.model is not None:
        raise ConfigError("--artifacts replaces --model (the artifacts hold the weights)")
    SamplingConfig(ns.temperature, ns.top_k, ns.top_p, ns.seed)  # validates
    for text in ns.prompt:
        check_text(text, name="--prompt")  # before the tokenizer sees it
    root = Path(ns.artifacts)
    manifest = read_manifest(root)  # checked against its own digest
    if is_launched(os.environ):
        world = plan_from_env(os.environ).world_size
    else:  # the ranks this command will start
        world = (ns.tp or manifest.tp) * (ns.pp or manifest.pp)
    check_layout(manifest, world_size=world, tp=ns.tp, pp=ns.pp)
    quant = requested(ns)
    check_quantization(manifest, None if quant is None else quant.to_dict())
    check_options(manifest, run_options(ns))
    ns.tp, ns.pp = manifest.tp, manifest.pp
    if manifest.tokenizer:  # before the tokenizer is parsed: a damaged file is named
        verify_files(root, manifest.tokenizer)
    tok = _tokenizer(root, model_args(manifest).vocab_size)
    prompts = [tok.encode(text) for text in ns.prompt]
    if any(not p for p in prompts):
        raise ConfigError("a prompt is empty; give at least one token of text")
    check_length(manifest, max(len(p) for p in prompts), ns.max_new_tokens)
    return prompts


def rank_main(ns: argparse.Namespace) -> int:
    """One rank: check and load the artifacts, generate, report on rank 0."""
    import torch.distributed as dist

    from torch_tensorrt_dist.artifacts import load_generator
    from torch_tensorrt_dist.cli._output import Output
    from torch_tensorrt_dist.generation import SamplingConfig
    from torch_tensorrt_dist.runtime import init_distributed, plan_from_env

    prompts = plan_artifacts(ns)
    world = plan_from_env(os.environ).world_size  # torchrun's or Open MPI's variables
    rank = 0
    if world > 1:
        rank = init_distributed().rank
    gen = load_generator(
        ns.artifacts, tp=ns.tp, pp=ns.pp, prefix_caching=getattr(ns, "prefix_caching", True)
    )
    tok = _tokenizer(Path(ns.artifacts), gen.args.vocab_size)
    stop_ids = tok.eos_ids or gen.args.eos_token_ids
    out = Output(ns, tok, len(prompts), stop_ids, rank)
    on_step = out.on_step()
    result = gen.generate(
        prompts,
        max_new_tokens=ns.max_new_tokens,
        sampling=SamplingConfig(ns.temperature, ns.top_k, ns.top_p, ns.seed),
        stop_ids=stop_ids,
        on_step=on_step,
    )
    fields = {
        "tp": ns.tp,
        "pp": ns.pp,
        "engine": gen.engine,
        "load_s": gen.load_s,
        "dtype": gen.manifest.dtype,
        "model": f"artifacts:{ns.artifacts}",
        "quantize": gen.manifest.quantization,
    }
    out.result(result, fields, f"[tp={ns.tp} {gen.engine}] load {gen.load_s:.2f} s,")
    if world > 1:
        dist.destroy_process_group()
    return 0
