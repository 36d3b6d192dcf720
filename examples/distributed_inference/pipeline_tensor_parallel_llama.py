"""Pipeline x tensor parallel Llama generation on a 2-D (pp, tp) mesh.

    torchrun --nproc-per-node 4 examples/distributed_inference/pipeline_tensor_parallel_llama.py \\
        --pp 2 --tp 2 --engine eager --prompt "The quick brown fox" --max-new-tokens 32

The layers are split into ``--pp`` stages (``--split 1,3`` for an uneven split); the first
stage holds the embedding, the last the final norm and LM head. Each rank reads only its
stage's layers and its TP slices of the checkpoint (``--model``, a Hugging Face Llama, Mistral
or Qwen2 directory; default: the shipped demo checkpoint, or random ``tiny`` weights with 4
layers where it is absent) and runs the generation core over its stage's part of the paged step
(compiled with the TP all-reduces on the stage's TP group): hidden states go to the next stage
with send/recv, and the last stage's logits come back to every rank by a broadcast, so every
rank samples the same tokens. Rank 0 streams the text and prints one JSON line: tokens, time to
first token, decode tokens/s and every rank's peak memory (ru_maxrss). ``--check`` also runs
the unsharded model on rank 0 and reports whether the tokens match. Runs on CPU (gloo) and GPUs
(nccl; ``--engine tensorrt`` needs TensorRT and Torch-TensorRT).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import torch_tensorrt_dist
from torch_tensorrt_dist.generation import Generator, SamplingConfig, TextStream
from torch_tensorrt_dist.generation.pipeline import PipelineGenerator
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs, read_config
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama, random_llama
from torch_tensorrt_dist.parallel.pipeline import check_mesh, make_pipeline_mesh, stage_place

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
RANDOM_ARGS = ModelArgs.from_name("tiny", n_layers=4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="HF checkpoint directory")
    p.add_argument("--pp", type=int, default=2, help="pipeline stages")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks per stage")
    p.add_argument("--split", default=None, help="layers per stage, e.g. 1,3 (default: even)")
    p.add_argument("--engine", choices=("tensorrt", "inductor", "eager", "none"), default="eager")
    p.add_argument("--prompt", default="The quick brown fox")
    p.add_argument("--batch", type=int, default=1, help="repeat the prompt this many times")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = torch_tensorrt_dist.init_distributed()
    path = _checkpoint(args.model)
    model_args = read_config(path) if path is not None else RANDOM_ARGS
    split = [int(n) for n in args.split.split(",")] if args.split else None
    check_mesh(args.pp, args.tp, info.world_size, model_args)
    place = stage_place(make_pipeline_mesh(args.pp, args.tp), model_args.n_layers, split)
    dtype = DTYPES[args.dtype]
    stage: Transformer  # this rank's stage: its layers and TP slices only
    if path is None:
        stage = random_llama(model_args, group=place.tp_group, dtype=dtype, stage=place.role).to(
            info.device
        )
    else:
        stage = load_llama(
            path,
            group=place.tp_group,
            dtype=dtype,
            device=info.device,
            progress=False,
            stage=place.role,
        )
    tok = load_tokenizer(path, vocab_size=model_args.vocab_size)
    prompts = [tok.encode(args.prompt)] * args.batch
    stop_ids = tuple(tok.eos_ids or model_args.eos_token_ids)
    sampling = SamplingConfig(args.temperature, args.top_k, None, args.seed)
    need = len(prompts[0]) + args.max_new_tokens + 16
    cache_len = min(model_args.max_seq_len, 64 * -(-need // 64))

    gen = PipelineGenerator(
        stage, place, engine=args.engine, max_batch_size=args.batch, cache_len=cache_len
    )
    compile_s = gen.warmup(len(prompts[0]), args.max_new_tokens, args.batch)
    stream = TextStream(tok, len(prompts))

    def show(step_ids: list[list[int]]) -> None:
        print(stream.push(step_ids, stop_ids)[0], end="", flush=True)

    if info.is_main:
        print(args.prompt, end="", flush=True)
    result = gen.generate(
        prompts,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        stop_ids=stop_ids,
        on_step=show if info.is_main else None,
    )
    # ru_maxrss is in KiB on Linux; gathered once, after generation
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    all_rss: list[float] = [0.0] * info.world_size
    dist.all_gather_object(all_rss, rss_mib)
    summary = {
        "tokens": result.tokens[0],
        "ttft_s": result.ttft_s,
        "tokens_per_s": result.tokens_per_s,
        "decode_steps": result.decode_steps,
        "compile_s": compile_s,
        "pp": args.pp,
        "tp": args.tp,
        "layers": list(place.role.layers),
        "engine": args.engine,
        "batch": args.batch,
        "peak_rss_mib": [round(r, 1) for r in all_rss],
    }
    ok = True
    if args.check and info.is_main:  # the unsharded model, plain PyTorch, on rank 0
        whole = (
            random_llama(model_args, dtype=dtype)
            if path is None
            else load_llama(path, dtype=dtype, device=info.device, progress=False)
        )
        ref = Generator(whole.to(info.device), max_batch_size=args.batch, cache_len=cache_len)
        expected = ref.generate(
            prompts, max_new_tokens=args.max_new_tokens, sampling=sampling, stop_ids=stop_ids
        ).tokens
        ok = summary["match"] = expected == result.tokens
    if info.is_main:
        print("\n" + json.dumps(summary), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
