"""One rank of ``torchtrt-dist serve``: plan (also in the launching process), load, serve."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from torch_tensorrt_dist.cli._failures import exit_codes
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.models.tokenizer import Tokenizer

if TYPE_CHECKING:  # the serving package needs the serve extra: imported when a rank starts
    from torch_tensorrt_dist.serving.server import ServeResult

__all__ = ["ServePlan", "plan", "rank_entry", "rank_main"]

DEFAULT_MAX_SEQ = 2048
DEFAULT_ROWS = 8
#: the environment variable --api-key defaults to (and the printed curl line reads)
API_KEY_ENV = "TORCHTRT_API_KEY"


@dataclass
class ServePlan:
    """What every rank (and the launching process) derives from the options alone."""

    path: Path | None
    preset: str | None
    args: ModelArgs
    cache_len: int
    name: str
    moe: MoEArgs | None = None


def plan(ns: argparse.Namespace) -> ServePlan:
    """Check the model, layout and cache length; ``--artifacts`` sets tp from the manifest."""
    if ns.artifacts:
        return _plan_artifacts(ns)
    from torch_tensorrt_dist.cli._quantize import check_quantize
    from torch_tensorrt_dist.cli.generate import _resolve_model
    from torch_tensorrt_dist.cli.generate_moe import plan_moe
    from torch_tensorrt_dist.models.loader import read_config
    from torch_tensorrt_dist.parallel.llama import tp_layout

    ns.split = None  # plan_moe reads the pipeline options of generate
    path, preset = _resolve_model(ns.model)
    moe = plan_moe(ns, path)
    if moe is not None:
        args = moe[0]
    else:
        args = read_config(path) if path is not None else ModelArgs.from_name(preset or "tiny")
    tp_layout(args, 0, ns.tp, ns.lm_head, ns.embedding)
    # --quantize: the same checks as generate (scheme, group size vs each rank's slices/engine)
    check_quantize(ns, args, tp=ns.tp, expert_size=None if moe is None else moe[1].expert_size)
    ns.max_batch_size = ns.max_batch_size or DEFAULT_ROWS
    cache_len = min(args.max_seq_len, ns.max_seq_len or DEFAULT_MAX_SEQ)
    if cache_len < 2:
        raise ConfigError(f"--max-seq-len {ns.max_seq_len} leaves no room: give at least 2")
    name = ns.served_model_name or (path.name if path is not None else str(preset))
    return ServePlan(path, preset, args, cache_len, name, None if moe is None else moe[1])


def _plan_artifacts(ns: argparse.Namespace) -> ServePlan:
    from torch_tensorrt_dist.artifacts.load import check_options, model_args
    from torch_tensorrt_dist.artifacts.manifest import check_layout, read_manifest
    from torch_tensorrt_dist.cli._generate_artifacts import run_options

    if ns.model is not None:
        raise ConfigError("--artifacts replaces --model (the artifacts hold the weights)")
    if getattr(ns, "quantize", None) is not None:
        raise ConfigError(
            f"--quantize {ns.quantize} with --artifacts: the artifacts hold their "
            "weights as compiled; drop --quantize, or compile them with "
            f"`torchtrt-dist compile --quantize {ns.quantize}`"
        )
    root = Path(ns.artifacts)
    manifest = read_manifest(root)
    world = int(os.environ.get("WORLD_SIZE", str(manifest.world_size)))
    check_layout(manifest, world_size=world, tp=ns.tp, pp=ns.pp)
    # rows, lengths, the KV pool and the prefill budget are constants of the graphs
    check_options(manifest, run_options(ns))
    ns.tp, ns.ep, ns.max_batch_size = manifest.tp, 1, manifest.max_batch_size
    name = ns.served_model_name or root.resolve().name
    return ServePlan(None, None, model_args(manifest), manifest.cache_len, name)


def _ready(ns: argparse.Namespace, plan_: ServePlan, engine: str, url: str, warm_s: float) -> None:
    body = json.dumps({"model": plan_.name, "prompt": "The return statement", "max_tokens": 32})
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if ns.api_key else ""
    print(
        f"serving {plan_.name} at {url}/v1 (tp={ns.tp} ep={ns.ep}, engine {engine}, "
        f"{ns.max_batch_size} rows x {plan_.cache_len} tokens, warm-up {warm_s:.1f} s)",
        flush=True,
    )
    print(
        f"curl {url}/v1/completions -H 'Content-Type: application/json'{auth} -d '{body}'",
        flush=True,
    )


def rank_main(ns: argparse.Namespace) -> int:
    """Set up distributed, load this rank's model, serve until stopped; the exit code."""
    return _serve(ns).code


def _serve(ns: argparse.Namespace) -> ServeResult:
    import torch.distributed as dist

    from torch_tensorrt_dist.cli._failures import check_world
    from torch_tensorrt_dist.runtime import agreed, init_distributed
    from torch_tensorrt_dist.serving.chat import load_chat_template
    from torch_tensorrt_dist.serving.server import ServeConfig, serve_rank

    world = check_world({"ep": ns.ep, "tp": ns.tp})
    device: torch.device | str = "cuda" if torch.cuda.is_available() else "cpu"
    rank = 0
    if world > 1:
        info = init_distributed()
        rank, device = info.rank, info.device
    # every rank plans and loads its own shard; none goes on to a collective until all have
    # (runtime.agree: one rank's error stops every rank, naming it)
    with agreed("loading the checkpoint" if not ns.artifacts else "loading the artifacts"):
        p = plan(ns)
        gen, tok, source = _load(ns, p, world, device)
    control: dist.ProcessGroup | None = None
    if world > 1:
        # the control channel's own gloo group, on every rank in the same order, after the
        # model's groups (artifacts find theirs by name, and names follow creation order)
        group = dist.new_group(backend="gloo")
        if not isinstance(group, dist.ProcessGroup):
            raise ConfigError(f"rank {rank} is not in the world group; relaunch every rank")
        control = group
    stop_ids = tuple(tok.eos_ids or p.args.eos_token_ids)
    config = ServeConfig(
        host=ns.host,
        port=ns.port,
        api_key=ns.api_key,
        max_queue=ns.max_queue,
        drain_timeout_s=ns.drain_timeout,
        model_name=p.name,
    )
    result = serve_rank(
        gen,
        tokenizer=tok,
        chat=load_chat_template(source),
        stop_ids=stop_ids,
        config=config,
        control=control,
        on_ready=lambda url, s: _ready(ns, p, gen.engine, url, s),
    )
    print(result.summary, file=sys.stderr, flush=True)
    if result.code == 0:
        drain_dir = getattr(ns, "drain_dir", None)
        if drain_dir:
            Path(drain_dir, f"rank-{rank}.drained").touch()
        if world > 1:
            dist.destroy_process_group()
    return result


def _load(
    ns: argparse.Namespace, p: ServePlan, world: int, device: torch.device | str
) -> tuple[Generator, Tokenizer, Path | None]:
    """(generator, tokenizer, the folder of the tokenizer files) of this rank."""
    import torch.distributed as dist

    from torch_tensorrt_dist.cli._quantize import quantize_rank
    from torch_tensorrt_dist.cli.generate import DTYPES
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer

    if ns.artifacts:
        from torch_tensorrt_dist.artifacts import load_generator

        loaded = load_generator(
            ns.artifacts, tp=ns.tp, prefix_caching=getattr(ns, "prefix_caching", True)
        )
        source = Path(ns.artifacts) / "tokenizer"
        source_dir = source if source.is_dir() else None
        return loaded, load_tokenizer(source_dir, vocab_size=loaded.args.vocab_size), source_dir
    from torch_tensorrt_dist.models.loader import load_llama, random_llama

    dtype = DTYPES[ns.dtype]
    group = dist.group.WORLD if world > 1 else None
    if p.moe is not None and p.path is not None:
        from torch_tensorrt_dist.cli.generate_moe import load_moe_rank

        model = load_moe_rank(
            ns, p.path, world=world, dtype=dtype, device=device, max_seq_len=p.args.max_seq_len
        )
    elif p.path is not None:
        model = load_llama(
            p.path,
            group=group,
            dtype=dtype,
            device=device,
            lm_head=ns.lm_head,
            embedding=ns.embedding,
            max_seq_len=p.args.max_seq_len,
            progress=False,
        )
    else:
        model = random_llama(
            p.args, seed=0, group=group, dtype=dtype, lm_head=ns.lm_head, embedding=ns.embedding
        ).to(device)
    quantize_rank(model, ns, engine=ns.engine)  # --quantize: this rank's shard, in place
    gen = Generator(
        model,
        engine=ns.engine,
        max_batch_size=ns.max_batch_size,
        cache_len=p.cache_len,
        verify=ns.verify,
    )
    return gen, load_tokenizer(p.path, vocab_size=p.args.vocab_size), p.path


def rank_entry(ns: argparse.Namespace) -> None:
    """Entry of a rank our launcher started: exit non-zero on error (the error travels to the
    launcher, which stops the others and prints the first failed rank's line)."""
    with exit_codes():
        result = _serve(ns)
    if result.code:
        raise SystemExit(result.code) from result.error
    if result.signal is not None:
        # The launcher forwarded a SIGTERM (or SIGINT) and now waits for this process to end:
        # the drain has finished, so end by that signal, as asked (returning would leave the
        # process waiting for a launcher that no longer reads its result).
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        signal.signal(result.signal, signal.SIG_DFL)
        os.kill(os.getpid(), result.signal)
