"""An HF transformers model sharded by its own ``tp_plan="auto"``, through our backend.

    torchrun --nproc-per-node 2 examples/distributed_inference/hf_transformers_tp.py
    torchrun --nproc-per-node 2 examples/distributed_inference/hf_transformers_tp.py \\
        --engine inductor --bench 32 --explain

Loads the model twice on every rank: whole (the reference) and sharded by transformers' tensor
parallelism (``from_pretrained(..., tp_plan="auto")``). Counts the collectives the uncompiled
sharded forward issues, runs ``explain`` and compares the logits of its lowered graphs (the eager
engine) with the whole model's, and, for another ``--engine``, those of ``model.forward``
compiled with it. With ``--bench N`` it also
times transformers' own static-cache ``generate`` of N tokens, eager and with its decode step
compiled by our backend (``CompileConfig(backend="torch_tensorrt_dist")``), and checks they
give the same tokens. Without ``--model`` it writes a small random Llama checkpoint first.
Rank 0 prints one JSON line. CPU (gloo) or GPUs (nccl).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import torch_tensorrt_dist
from torch_tensorrt_dist.backend.collective_events import outermost_collectives


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="an HF checkpoint folder (default: a small random Llama)")
    p.add_argument("--engine", choices=("tensorrt", "inductor", "eager"), default="eager")
    p.add_argument("--hidden", type=int, default=128, help="of the random Llama")
    p.add_argument("--layers", type=int, default=2, help="of the random Llama")
    p.add_argument("--seq", type=int, default=12, help="prompt tokens")
    p.add_argument("--bench", type=int, default=0, help="time generate of this many tokens")
    p.add_argument("--repeats", type=int, default=3, help="timed generate calls of each kind")
    p.add_argument("--explain", action="store_true", help="print rank 0's explain report")
    return p.parse_args(argv)


def random_llama(folder: str, args: argparse.Namespace) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    LlamaForCausalLM(config).save_pretrained(folder)


def bench(model: Any, ids: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """Tokens per second of static-cache greedy generate: eager TP, and with its decode step
    compiled by our backend through transformers' own CompileConfig."""
    from transformers import CompileConfig

    compile_config = CompileConfig(
        backend="torch_tensorrt_dist",
        options={"engine": args.engine},
        fullgraph=True,
        dynamic=False,
        mode=None,  # type: ignore[arg-type]  # torch.compile takes a mode or options
    )
    # transformers compiles the decode step on accelerators only, unless told
    compile_config._compile_all_devices = not torch.cuda.is_available()
    common = {
        "max_new_tokens": args.bench,
        "min_new_tokens": args.bench,
        "do_sample": False,
        "cache_implementation": "static",
    }
    kinds = {"eager": {"disable_compile": True}, "compiled": {"compile_config": compile_config}}
    tokens: dict[str, list[int]] = {}
    seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kind, extra in kinds.items():
        tokens[kind] = model.generate(ids, **common, **extra)[0].tolist()  # warm-up, compile
    for _ in range(args.repeats):  # interleaved, so drift on a busy machine hits both
        for kind, extra in kinds.items():
            dist.barrier()
            start = time.perf_counter()
            model.generate(ids, **common, **extra)
            seconds[kind].append(time.perf_counter() - start)
    rate = {kind: [args.bench / s for s in seconds[kind]] for kind in kinds}
    ratios = [c / e for c, e in zip(rate["compiled"], rate["eager"])]
    return {
        "new_tokens": args.bench,
        "same_tokens": tokens["eager"] == tokens["compiled"],
        "eager_tok_s": round(statistics.median(rate["eager"]), 1),
        "compiled_tok_s": round(statistics.median(rate["compiled"]), 1),
        "speedup": round(statistics.median(ratios), 2),
        "speedup_min_max": [round(min(ratios), 2), round(max(ratios), 2)],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = torch_tensorrt_dist.init_distributed()
    from transformers import AutoModelForCausalLM

    folder = args.model
    made = [tempfile.mkdtemp(prefix="hf_tp_") if info.rank == 0 and not folder else None]
    if not folder:
        if info.rank == 0:
            random_llama(made[0], args)
        dist.broadcast_object_list(made, src=0)
        folder = made[0]
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, tp_plan="auto")
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, args.seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids).logits
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            uncompiled = model(ids).logits
    # explain runs the model through the lowered graphs (the eager engine): a hook keeps the
    # logits of its counted call, in a dict whose key exists already (a new key would change
    # what Dynamo guards on, and recompile)
    kept: dict[str, Any] = {"logits": None}
    hook = model.register_forward_hook(lambda m, a, out: kept.__setitem__("logits", out.logits))
    report = torch_tensorrt_dist.explain(model, ids)
    hook.remove()
    logits = kept["logits"]
    if args.explain and info.rank == 0:
        print(report, file=sys.stderr)
    result: dict[str, Any] = {
        "rank": info.rank,
        "uncompiled": {
            "collectives": len(outermost_collectives(prof.events())),
            "max_abs_err": (uncompiled - expected).abs().max().item(),
        },
        "compiled": {
            "max_abs_err": (logits - expected).abs().max().item(),
            "graphs": report.graph_count,
            "graph_breaks": len(report.graph_breaks),
            "per_call": report.collectives_per_call,
            "listed": len(report.collectives),
            "modules": sorted({c.module for c in report.collectives}),
            "summary": str(report).splitlines()[1].strip(),
        },
    }
    if args.engine != "eager":  # the engine itself, as transformers users compile
        compiled = torch.compile(
            model.forward, backend="torch_tensorrt_dist", options={"engine": args.engine}
        )
        with torch.no_grad():
            engine_logits = compiled(ids).logits
        result["compiled"]["engine_max_abs_err"] = (engine_logits - expected).abs().max().item()
        torch._dynamo.reset()
    if args.bench:
        result["bench"] = bench(model, ids, args)
    ranks: list[Any] = [None] * info.world_size
    dist.all_gather_object(ranks, result)
    if info.rank == 0:
        print(json.dumps({"engine": args.engine, "ranks": ranks}))
        if made[0]:
            shutil.rmtree(made[0], ignore_errors=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
