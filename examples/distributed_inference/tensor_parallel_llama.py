"""Tensor-parallel Llama generation: a compiled prefill and decode graph per rank.

    torchrun --nproc-per-node 2 examples/distributed_inference/tensor_parallel_llama.py \\
        --engine eager --prompt "The quick brown fox" --max-new-tokens 32

Each rank reads only its slices of the checkpoint (``--model``, a Hugging Face Llama, Mistral or
Qwen2 directory; default: the shipped demo checkpoint, or random ``tiny`` weights where it is
absent), shards attention and MLP over the TP group (2 all-reduces per layer) and generates
with the same seeded sampling on every rank. Rank 0 streams the text and prints one JSON line
with the tokens, time to first token and decode tokens/s. ``--check`` also runs the unsharded
model in every rank and reports whether the tokens match. Runs on CPU (gloo) and GPUs (nccl;
``--engine tensorrt`` needs TensorRT and Torch-TensorRT).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

import torch_tensorrt_dist
from torch_tensorrt_dist.generation import Generator, SamplingConfig, TextStream
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel import make_mesh
from torch_tensorrt_dist.parallel.llama_load import load_llama, random_llama

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="HF checkpoint directory")
    p.add_argument("--engine", choices=("tensorrt", "inductor", "eager", "none"), default="eager")
    p.add_argument("--prompt", default="The quick brown fox")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--check", action="store_true", help="compare with the unsharded model")
    return p.parse_args(argv)


def _checkpoint(model: Path | None) -> Path | None:
    if model is not None:
        return model
    try:
        from torch_tensorrt_dist.models.demo import demo_checkpoint_path

        return demo_checkpoint_path()
    except (ImportError, torch_tensorrt_dist.ConfigError):
        return None


def _load(path: Path | None, group: Any, dtype: torch.dtype, device: str) -> Transformer:
    if path is None:
        return random_llama(ModelArgs.from_name("tiny"), group=group, dtype=dtype).to(device)
    return load_llama(path, group=group, dtype=dtype, device=device, progress=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = torch_tensorrt_dist.init_distributed()
    tp_group = make_mesh(tp=info.world_size)["tp"].get_group() if info.world_size > 1 else None
    path = _checkpoint(args.model)
    dtype = DTYPES[args.dtype]
    model = _load(path, tp_group, dtype, info.device)
    tok = load_tokenizer(path, vocab_size=model.args.vocab_size)
    prompt = tok.encode(args.prompt)
    stop_ids = tuple(tok.eos_ids or model.args.eos_token_ids)
    sampling = SamplingConfig(args.temperature, args.top_k, None, args.seed)
    cache_len = min(model.args.max_seq_len, 64 * -(-(len(prompt) + args.max_new_tokens + 16) // 64))

    gen = Generator(model, engine=args.engine, cache_len=cache_len)
    compile_s = gen.warmup(len(prompt), args.max_new_tokens)
    stream = TextStream(tok, 1)

    def show(new: list[list[int]]) -> None:  # each prompt's new ids of a step
        print(stream.push(new, stop_ids)[0], end="", flush=True)

    if info.is_main:
        print(args.prompt, end="", flush=True)
    result = gen.generate(
        [prompt],
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        stop_ids=stop_ids,
        on_step=show if info.is_main else None,
    )
    summary = {
        "tokens": result.tokens[0],
        "ttft_s": result.ttft_s,
        "tokens_per_s": result.tokens_per_s,
        "compile_s": compile_s,
        "tp": info.world_size,
        "engine": args.engine,
    }
    if args.check:  # the unsharded model, plain PyTorch, in this rank
        ref = Generator(_load(path, None, dtype, info.device), cache_len=cache_len)
        expected = ref.generate(
            [prompt], max_new_tokens=args.max_new_tokens, sampling=sampling, stop_ids=stop_ids
        ).tokens[0]
        summary["match"] = expected == result.tokens[0]
    if info.is_main:
        print("\n" + json.dumps(summary), flush=True)
    torch.distributed.destroy_process_group()
    return 0 if summary.get("match", True) else 1


if __name__ == "__main__":
    sys.exit(main())
