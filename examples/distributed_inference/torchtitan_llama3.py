"""torchtitan's Llama 3 debug model, sharded by torchtitan's own TP code, through our backend.

    torchrun --nproc-per-node 2 examples/distributed_inference/torchtitan_llama3.py
    torchrun --nproc-per-node 2 examples/distributed_inference/torchtitan_llama3.py \\
        --engine inductor --sp on --compile blocks --explain

Needs torchtitan 0.3.0 without its training dependencies:
``pip install --no-deps torchtitan==0.3.0 && pip install 'torch_tensorrt_dist[torchtitan]'``.

For each sequence-parallel setting the program builds torchtitan's ``debugmodel`` (cut to
``--layers`` blocks), shards it with torchtitan's TP code (``Module.parallelize``, what
``parallelize_llama`` calls for TP), counts the collectives the uncompiled model issues, then
explains it two ways: the whole model, and each block compiled on its own (``compile_blocks``,
what torchtitan's ``apply_compile`` does with Inductor). For each it compares the logits of the
lowered graphs (``explain``'s run: the eager engine) with the unsharded model's, and, for
another ``--engine``, those of the model compiled with it. Rank 0 prints one JSON line. CPU
(gloo) or GPUs (nccl).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import torch_tensorrt_dist
from torch_tensorrt_dist.backend.collective_events import outermost_collectives


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=("tensorrt", "inductor", "eager"), default="eager")
    p.add_argument("--layers", type=int, default=6, help="blocks of the debug model (it has 6)")
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--sp", choices=("off", "on", "both"), default="both")
    p.add_argument("--compile", choices=("whole", "blocks", "both"), default="both")
    p.add_argument(
        "--spmd-backend", choices=("spmd_types", "partial_dtensor"), default="spmd_types"
    )
    p.add_argument(
        "--parallelize",
        choices=("tp", "llama"),
        default="tp",
        help="tp: Module.parallelize (the TP of parallelize_llama); llama: parallelize_llama, "
        "which also wraps the model in FSDP (fully_shard) even at dp 1",
    )
    p.add_argument("--explain", action="store_true", help="print rank 0's explain reports")
    return p.parse_args(argv)


def build(args: argparse.Namespace, sp: bool, world_size: int) -> tuple[Any, Any, Any, Any]:
    """(unsharded model, sharded model, the SPMD context of a call, the parallel dims)."""
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torchtitan.config import ParallelismConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as titan_dist
    from torchtitan.models.llama3 import llama3_configs
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    if not torch.cuda.is_available():
        # torchtitan 0.3.0 picks "cuda" when it finds no accelerator (tools/utils.py)
        parallel_dims_module.device_type = "cpu"
    titan_dist.set_spmd_backend(args.spmd_backend)
    parallelism = ParallelismConfig(
        tensor_parallel_degree=world_size,
        data_parallel_shard_degree=1,
        enable_sequence_parallel=sp,
        spmd_backend=args.spmd_backend,
    )
    dims = ParallelDims.from_config(parallelism, world_size)
    dims.build_mesh()
    config = llama3_configs["debugmodel"](attn_backend="flex")
    config.layers = config.layers[: args.layers]
    # what Llama3Model.Config.update_from_config does with a trainer config
    set_llama3_sharding_config(config, enable_sp=sp)
    torch.manual_seed(0)  # the same full weights on every rank
    model = config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    reference = copy.deepcopy(model)
    if args.parallelize == "tp":
        model.parallelize(dims)  # torchtitan's TP: shards states, wraps each forward
    else:
        from torchtitan.config import CompileConfig, TrainingConfig
        from torchtitan.models.llama3 import parallelize_llama

        model = parallelize_llama(
            model,
            parallel_dims=dims,
            training=TrainingConfig(mixed_precision_param="float32"),
            parallelism=parallelism,
            compile_config=CompileConfig(),
            ac_config=None,
            dump_folder=tempfile.gettempdir(),
        )
    return reference, model, titan_dist.get_spmd_context(parallel_dims=dims), dims


def inputs(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, Any]:
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common.attention import get_causal_mask_mod

    tokens = torch.randint(0, 2048, (1, args.seq), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(args.seq).unsqueeze(0)
    # one document per row: torchtitan's document mask is the causal mask (its own
    # get_attention_masks compiles create_block_mask with Inductor first: ~15 s on CPU)
    masks = create_block_mask(get_causal_mask_mod(), 1, None, args.seq, args.seq, device="cpu")
    return tokens, positions, masks


def full_logits(out: Any, vocab: int) -> torch.Tensor:
    """Logits of the whole vocabulary (torchtitan leaves the output sharded on it)."""
    if hasattr(out, "full_tensor"):
        out = out.full_tensor()
    if out.shape[-1] == vocab:
        return out
    parts = [torch.empty_like(out) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, out.contiguous())
    return torch.cat(parts, dim=-1)


@contextlib.contextmanager
def unfused_flex() -> Any:
    """Run flex attention unfused outside our graphs (torchtitan compiles it with Inductor on
    first eager use: slow on CPU); compiled graphs trace through either the same way."""
    from torch.nn.attention.flex_attention import flex_attention
    from torchtitan.models.common.attention import FlexAttention

    saved = FlexAttention._compiled_flex_attn
    FlexAttention._compiled_flex_attn = flex_attention
    try:
        yield
    finally:
        FlexAttention._compiled_flex_attn = saved


def explained(model: torch.nn.Module, call: tuple[Any, ...]) -> tuple[Any, torch.Tensor]:
    """``explain``'s report, and the logits of its counted call (the lowered graphs, run by the
    eager engine), kept by a hook in a dict whose key exists already (a new key would change
    what Dynamo guards on, and recompile)."""
    kept: dict[str, Any] = {"logits": None}
    hook = model.register_forward_hook(lambda m, a, out: kept.__setitem__("logits", out))
    try:
        with unfused_flex():
            report = torch_tensorrt_dist.explain(model, *call)
    finally:
        hook.remove()
    return report, kept["logits"]


def run_one(args: argparse.Namespace, sp: bool, rank: int, world_size: int) -> dict[str, Any]:
    reference, model, spmd, _ = build(args, sp, world_size)
    call = inputs(args)
    options = {"engine": args.engine}
    result: dict[str, Any] = {"sp": sp}
    with spmd(), torch.no_grad():
        with unfused_flex():
            expected = reference(*call)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out = model(*call)
        result["uncompiled"] = {
            "collectives": len(outermost_collectives(prof.events())),
            "max_abs_err": (full_logits(out, 2048) - expected).abs().max().item(),
        }
        modes = ("whole", "blocks") if args.compile == "both" else (args.compile,)
        for mode in modes:
            if mode == "blocks":
                torch_tensorrt_dist.compile_blocks(model, options=options)
            report, lowered = explained(model, call)
            if args.explain and rank == 0:
                print(f"--- sp={'on' if sp else 'off'}, {mode}\n{report}", file=sys.stderr)
            result[mode] = {
                "max_abs_err": (full_logits(lowered, 2048) - expected).abs().max().item(),
                "graphs": report.graph_count,
                "graph_breaks": len(report.graph_breaks),
                "units": len(report.compile_units),
                "runs": [g.runs for g in report.graphs],
                "listed": len(report.collectives),
                "per_call": report.collectives_per_call,
                "outside_graphs": sum(c.count for c in report.outside_graphs or ()),
                "modules": sorted({c.module for c in report.collectives}),
                "summary": str(report).splitlines()[1].strip(),
            }
            if args.engine != "eager":  # the engine itself, compiled as the mode says
                torch._dynamo.reset()
                compiled = (
                    model
                    if mode == "blocks"
                    else torch.compile(model, backend="torch_tensorrt_dist", options=options)
                )
                out = full_logits(compiled(*call), 2048)
                result[mode]["engine_max_abs_err"] = (out - expected).abs().max().item()
    return result


def apply_compile_refusal() -> str:
    """What torchtitan's own per-block compile says when asked for our backend."""
    from torchtitan.config import CompileConfig, ParallelismConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.compile import apply_compile
    from torchtitan.models.llama3 import llama3_configs

    config = llama3_configs["debugmodel"](attn_backend="flex")
    config.layers = config.layers[:1]
    with torch.device("meta"):
        model = config.build()
    dims = ParallelDims.from_config(ParallelismConfig(), 1)
    try:
        apply_compile(
            model,
            compile_config=CompileConfig(enable=True, backend="torch_tensorrt_dist"),
            parallel_dims=dims,
        )
    except ValueError as exc:
        return str(exc)
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = torch_tensorrt_dist.init_distributed()
    settings = (False, True) if args.sp == "both" else (args.sp == "on",)
    ranks: list[Any] = [None] * info.world_size
    runs = [run_one(args, sp, info.rank, info.world_size) for sp in settings]
    mine = {"rank": info.rank, "runs": runs}
    dist.all_gather_object(ranks, mine)
    if info.rank == 0:
        print(json.dumps({"ranks": ranks, "apply_compile_refuses": apply_compile_refusal()}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
