"""Mixture-of-experts generation with expert parallel x tensor parallel: one graph per rank.

    torchrun --nproc-per-node 4 examples/distributed_inference/expert_parallel_moe.py \\
        --model path/to/Mixtral-or-Qwen2-MoE --ep 2 --engine eager --prompt "Hello" --check

The job's ``ep x tp`` ranks (``tp`` = world size / ``--ep``, TP inner) each read only their
experts' TP slices of the checkpoint (``--model``, a Hugging Face Mixtral or Qwen2/3-MoE
directory; default: a tiny random Mixtral-style model). Attention is tensor parallel over the
TP group; the experts are split over the EP ranks and each expert's SwiGLU over TP; every MoE
layer ends in one all-reduce over the EP x TP group. Rank 0 streams the text and prints one
JSON line with the tokens, timings and the bytes this rank read. ``--check`` also runs the
unsharded model in every rank and reports whether the tokens match. Runs on CPU (gloo) and
GPUs (nccl; ``--engine tensorrt`` needs TensorRT and Torch-TensorRT).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import torch_tensorrt_dist
from torch_tensorrt_dist.generation import Generator, SamplingConfig, TextStream
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe import MoETransformer
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.moe import MoEGroups, make_moe_mesh, moe_groups
from torch_tensorrt_dist.parallel.moe_load import load_moe, random_moe

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: the model without --model: 2 layers, 8 experts of which each token uses 2
TINY = ModelArgs(
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=256,
    intermediate_size=128,
    max_seq_len=256,
)
TINY_MOE = MoEArgs(n_experts=8, top_k=2, expert_size=128, sparse_layers=(0, 1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="HF Mixtral/Qwen2/3-MoE directory")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel ranks (default: all)")
    p.add_argument("--engine", choices=("tensorrt", "inductor", "eager", "none"), default="eager")
    p.add_argument("--prompt", default="The quick brown fox")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--check", action="store_true", help="compare with the unsharded model")
    return p.parse_args(argv)


def _load(
    path: Path | None, groups: MoEGroups | None, dtype: torch.dtype, device: str
) -> MoETransformer:
    if path is None:
        return random_moe(TINY, TINY_MOE, groups=groups, dtype=dtype).to(device)
    return load_moe(path, groups=groups, dtype=dtype, device=device, progress=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = torch_tensorrt_dist.init_distributed()
    ep = args.ep or info.world_size
    if ep < 1 or info.world_size % ep:
        raise torch_tensorrt_dist.ConfigError(
            f"--ep {ep} must divide the {info.world_size} ranks (tp = ranks / ep)"
        )
    tp = info.world_size // ep
    groups = moe_groups(make_moe_mesh(ep, tp)) if info.world_size > 1 else None
    dtype = DTYPES[args.dtype]
    model = _load(args.model, groups, dtype, info.device)
    tok = load_tokenizer(args.model, vocab_size=model.args.vocab_size)
    prompt = tok.encode(args.prompt)
    stop_ids = tuple(tok.eos_ids or model.args.eos_token_ids)
    sampling = SamplingConfig(args.temperature, None, None, args.seed)
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
        "ep": ep,
        "tp": tp,
        "engine": args.engine,
        "bytes_read": model.bytes_read,
    }
    if args.check:  # the unsharded model, plain PyTorch, in this rank
        ref = Generator(_load(args.model, None, dtype, info.device), cache_len=cache_len)
        expected = ref.generate(
            [prompt], max_new_tokens=args.max_new_tokens, sampling=sampling, stop_ids=stop_ids
        ).tokens[0]
        summary["match"] = expected == result.tokens[0]
    if info.is_main:
        print("\n" + json.dumps(summary), flush=True)
    if info.world_size > 1:
        torch.distributed.destroy_process_group()
    return 0 if summary.get("match", True) else 1


if __name__ == "__main__":
    sys.exit(main())
