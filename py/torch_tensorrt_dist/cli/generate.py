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
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist.cli._failures import (
    alike_on_every_rank,
    check_world,
    print_launch_failure,
    rank_entry,
    refuse,
    world_size,
)
from torch_tensorrt_dist.cli._output import Output
from torch_tensorrt_dist.cli._quantize import add_quantize_args, check_quantize, quantize_rank
from torch_tensorrt_dist.cli.generate_moe import load_moe_rank, plan_moe
from torch_tensorrt_dist.errors import (
    ConfigError,
    EngineUnavailableError,
    TensorRTDistError,
    VerificationError,
)
from torch_tensorrt_dist.models.llama import PRESETS, ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs

__all__ = ["register", "run"]

logger = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ENGINE_CHOICES = ("tensorrt", "inductor", "eager", "none")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with a tensor-parallel Llama/Mistral/Qwen2 model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        default=None,
        help="HF checkpoint directory or preset name (default: the demo checkpoint)",
    )
    p.add_argument(
        "--tp",
        type=int,
        default=None,
        help="tensor-parallel ranks (default: WORLD_SIZE / pp under a launcher, else 1)",
    )
    p.add_argument(
        "--pp",
        type=int,
        default=1,
        help="pipeline stages (default 1); the job has pp x tp ranks, TP inner",
    )
    p.add_argument(
        "--ep",
        type=int,
        default=1,
        help="expert-parallel ranks for a MoE checkpoint (default 1); ep x tp ranks, TP inner",
    )
    p.add_argument(
        "--split",
        default=None,
        help="layers per pipeline stage, comma-separated (default: even), e.g. 3,5",
    )
    p.add_argument(
        "--microbatches",
        type=int,
        default=None,
        help="pipeline microbatches (default: pp when it divides the batch, else 1)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default="eager",
        help="tensorrt | inductor | eager (compiled FX, the reference) | none "
        "(plain PyTorch, no torch.compile); default eager",
    )
    p.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check each compiled graph's first call against the eager run of the same graph "
        "(collectives through c10d) and stop on every rank on a mismatch "
        "(default: on for --engine tensorrt, off otherwise)",
    )
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
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="KV cache length (default: what the prompts and new tokens need)",
    )
    p.add_argument(
        "--lm-head",
        choices=("vocab_parallel", "replicated"),
        default="vocab_parallel",
        help="vocab_parallel: each TP rank holds 1/tp of the LM head, logits all-gathered",
    )
    p.add_argument(
        "--embedding",
        choices=("vocab_parallel", "replicated"),
        default="vocab_parallel",
        help="vocab_parallel: each TP rank holds 1/tp of the embedding, rows all-reduced; "
        "replicated: no collective, the whole matrix on every rank",
    )
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="time the first call too (compilation lands in ttft_s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on rank 0")
    add_quantize_args(p)
    p.add_argument(
        "--artifacts",
        default=None,
        metavar="DIR",
        help="start from `torchtrt-dist compile` artifacts (no checkpoint read, no compile)",
    )
    p.set_defaults(func=run)


@dataclass
class _Plan:
    """What every rank (and the launching process) derives from the arguments alone."""

    path: Path | None
    preset: str | None
    args: ModelArgs
    prompts: list[list[int]]
    cache_len: int
    moe: MoEArgs | None = None
    """The experts of a mixture-of-experts checkpoint, else None."""


def _resolve_model(model: str | None) -> tuple[Path | None, str | None]:
    if model is None:
        try:
            from torch_tensorrt_dist.models.demo import demo_checkpoint_path

            return demo_checkpoint_path(), None
        except (ImportError, ConfigError) as exc:
            logger.info("no demo checkpoint (%s); using the 'tiny' preset with random weights", exc)
            return None, "tiny"
    if Path(model).is_dir():
        return Path(model), None
    if model in PRESETS:
        return None, model
    raise ConfigError(
        f"--model {model!r} is neither a checkpoint directory nor a preset "
        f"({', '.join(sorted(PRESETS))})"
    )


def _plan(ns: argparse.Namespace) -> _Plan:
    from torch_tensorrt_dist.cli._generate_checks import check_options, check_request_fits
    from torch_tensorrt_dist.generation import check_lengths, prefill_bucket
    from torch_tensorrt_dist.models.llama_args import read_config
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer
    from torch_tensorrt_dist.models.weights_check import check_checkpoint
    from torch_tensorrt_dist.parallel.llama import tp_layout

    check_options(ns)
    path, preset = _resolve_model(ns.model)
    moe = plan_moe(ns, path)  # (args, MoEArgs) of a MoE checkpoint, checked for --ep x --tp
    if moe is not None:
        args = moe[0]
    else:
        args = read_config(path) if path is not None else ModelArgs.from_name(preset or "tiny")
    if path is not None:  # config.json against the headers, before anything is allocated
        check_checkpoint(path, args, None if moe is None else moe[1])
    tp_layout(args, 0, ns.tp, ns.lm_head, ns.embedding)  # heads / MLP divisible by tp
    quant = check_quantize(
        ns, args, tp=ns.tp, expert_size=None if moe is None else moe[1].expert_size
    )
    if quant is not None and (ns.pp > 1 or ns.split):
        raise ConfigError("--quantize with --pp is not supported yet; quantize with --tp only")
    if ns.pp > 1 or ns.split:
        from torch_tensorrt_dist.parallel.pipeline import check_mesh, split_layers

        check_mesh(ns.pp, ns.tp, ns.pp * ns.tp, args)
        split_layers(args.n_layers, ns.pp, _split(ns))
    tok = load_tokenizer(path, vocab_size=args.vocab_size)
    prompts = [tok.encode(text) for text in ns.prompt]
    check_request_fits(
        prompts, vocab_size=args.vocab_size, max_seq_len=ns.max_seq_len, model_max=args.max_seq_len
    )
    limit = min(args.max_seq_len, ns.max_seq_len or args.max_seq_len)
    for ids in prompts:
        check_lengths(len(ids), ns.max_new_tokens, limit)
    cache_len = ns.max_seq_len
    if cache_len is None:  # enough for the bucket and the new tokens, rounded up to 64
        need = max(prefill_bucket(len(p), ns.max_new_tokens, limit) for p in prompts)
        cache_len = min(limit, -(-(need + ns.max_new_tokens) // 64) * 64)
    return _Plan(path, preset, args, prompts, cache_len, None if moe is None else moe[1])


def _split(ns: argparse.Namespace) -> list[int] | None:
    if not ns.split:
        return None
    try:
        return [int(x) for x in ns.split.split(",")]
    except ValueError:
        raise ConfigError(
            f"--split {ns.split!r} is not a comma-separated list of integers"
        ) from None


def _rank_main(ns: argparse.Namespace) -> int:
    """One rank: set up distributed, load the shard, generate, report on rank 0."""
    import torch.distributed as dist

    from torch_tensorrt_dist.generation import Generator, SamplingConfig
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer
    from torch_tensorrt_dist.parallel.llama_load import load_llama, random_llama
    from torch_tensorrt_dist.runtime import agreed, init_distributed

    if getattr(ns, "artifacts", None):
        from torch_tensorrt_dist.cli._generate_artifacts import rank_main

        return rank_main(ns)
    if ns.ep > 1:
        world = check_world({"ep": ns.ep, "tp": ns.tp})
    else:
        world = check_world({"pp": ns.pp, "tp": ns.tp}, note="generate uses every rank: ")
    device: torch.device | str = "cpu"
    group = None
    rank = 0
    if world > 1:
        info = init_distributed()
        rank, group, device = info.rank, dist.group.WORLD, info.device
    elif torch.cuda.is_available():
        device = "cuda"
    # every rank plans and loads its own shard; no rank goes on (echoes the prompt, compiles,
    # runs a collective) until all have (runtime.agree: one rank's error stops every rank)
    with agreed("loading the checkpoint"):
        plan = _plan(ns)
        dtype = DTYPES[ns.dtype]
        if ns.pp > 1:
            pass  # each stage loads its own layers in generate_pipeline
        elif plan.moe is not None and plan.path is not None:
            model = load_moe_rank(
                ns,
                plan.path,
                world=world,
                dtype=dtype,
                device=device,
                max_seq_len=plan.args.max_seq_len,
            )
        elif plan.path is not None:
            model = load_llama(
                plan.path,
                group=group,
                dtype=dtype,
                device=device,
                lm_head=ns.lm_head,
                embedding=ns.embedding,
                max_seq_len=plan.args.max_seq_len,
            )
        else:
            model = random_llama(
                plan.args,
                seed=0,
                group=group,
                dtype=dtype,
                lm_head=ns.lm_head,
                embedding=ns.embedding,
            ).to(device)
        quant = None if ns.pp > 1 else quantize_rank(model, ns, engine=ns.engine)
        tok = load_tokenizer(plan.path, vocab_size=plan.args.vocab_size)
    stop_ids = tok.eos_ids or plan.args.eos_token_ids
    out = Output(ns, tok, len(plan.prompts), stop_ids, rank)
    on_step = out.on_step()
    sampling = SamplingConfig(ns.temperature, ns.top_k, ns.top_p, ns.seed)
    compile_s: float | None = None
    if ns.pp > 1:
        from torch_tensorrt_dist.generation.pipeline import generate_pipeline

        result = generate_pipeline(
            plan.path or plan.args,
            plan.prompts,
            pp=ns.pp,
            tp=ns.tp,
            engine=ns.engine,
            max_new_tokens=ns.max_new_tokens,
            sampling=sampling,
            stop_ids=stop_ids,
            split=_split(ns),
            dtype=dtype,
            lm_head=ns.lm_head,
            embedding=ns.embedding,
            cache_len=plan.cache_len,
            warmup=not ns.no_warmup,
            microbatches=ns.microbatches,
            on_step=on_step,
            verify=ns.verify,
        )
    else:
        gen = Generator(
            model,
            engine=ns.engine,
            max_batch_size=len(plan.prompts),
            cache_len=plan.cache_len,
            verify=ns.verify,
        )
        if not ns.no_warmup:
            compile_s = gen.warmup(
                max(map(len, plan.prompts)), ns.max_new_tokens, len(plan.prompts)
            )
        result = gen.generate(
            plan.prompts,
            max_new_tokens=ns.max_new_tokens,
            sampling=sampling,
            stop_ids=stop_ids,
            on_step=on_step,
        )
    model_name = str(plan.path) if plan.path else f"preset:{plan.preset} (random weights)"
    fields = {
        "tp": ns.tp,
        "pp": ns.pp,
        "ep": ns.ep,
        "engine": ns.engine,
        "compile_s": compile_s,
        "dtype": ns.dtype,
        "model": model_name,
        "quantize": None if quant is None else quant.to_dict(),
    }
    q = "" if quant is None else f" {quant.describe()}"
    status = f"[pp={ns.pp} tp={ns.tp} engine={ns.engine}{q}]"
    out.result(result, fields, status + (f" compile {compile_s:.1f} s," if compile_s else ""))
    if world > 1:
        dist.destroy_process_group()  # a normal end; after an error the launcher stops the ranks
    return 0


def _check_engine(engine: str, *, isolated: bool) -> None:
    """``--engine tensorrt`` where TensorRT cannot run: one line saying what to install, before
    any rank starts (``isolated``: the import is tried in a child, so the launcher stays free of
    CUDA state)."""
    if engine != "tensorrt":
        return
    from torch_tensorrt_dist.conversion.availability import tensorrt_engine_missing

    problem = tensorrt_engine_missing(isolated=isolated)
    if problem is not None:
        raise EngineUnavailableError(problem)


def run(ns: argparse.Namespace) -> int:
    from torch_tensorrt_dist.runtime import is_launched, launch

    launched = is_launched(os.environ)
    if getattr(ns, "artifacts", None):
        from torch_tensorrt_dist.cli._generate_artifacts import plan_artifacts

        ns.prompt = ns.prompt or ["The return statement"]
        try:
            with alike_on_every_rank():
                plan_artifacts(ns)  # sets tp/pp from the manifest; bad requests fail here
            if ns.tp * ns.pp == 1 or launched:
                return _rank_main(ns)
        except TensorRTDistError as exc:
            return refuse(exc, 2)
        ns.func = None
        result = launch(rank_entry, ns.tp * ns.pp, [_rank_main, ns])
        print_launch_failure(result, verbose=getattr(ns, "verbose", 0))
        return int(result.returncode)
    if ns.tp is None:
        ranks = world_size()
        ns.tp = max(1, ranks // (ns.pp * ns.ep)) if launched else 1
    ns.prompt = ns.prompt or ["The return statement"]
    try:
        with alike_on_every_rank():
            _plan(ns)  # bad input fails here, before any rank starts
        single = ns.tp * ns.pp * ns.ep == 1 or launched
        _check_engine(ns.engine, isolated=not single)
        if single:
            return _rank_main(ns)
    except VerificationError as exc:  # a wrong engine, not bad input
        return refuse(exc, 1)
    except TensorRTDistError as exc:
        return refuse(exc, 2)
    ns.func = None  # the ranks get a plain, picklable namespace
    result = launch(rank_entry, ns.tp * ns.pp * ns.ep, [_rank_main, ns])
    print_launch_failure(result, verbose=getattr(ns, "verbose", 0))
    return int(result.returncode)
