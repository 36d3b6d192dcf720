"""Compile once: every rank of a model family builds and writes its graphs and weight shard;
rank 0 the manifest (the files themselves: ``artifacts/build.py``).

    torchrun --nproc-per-node 2 -m torch_tensorrt_dist compile --model PATH --out DIR
    # or, on every rank of an initialised world:
    compile_artifacts("PATH", "DIR", max_seq_len=256, max_batch_size=8, kv_cache_memory=1 << 30)

The pool of KV blocks is part of what is compiled (its size is a constant of the graphs):
``kv_cache_memory`` bytes per rank, or room for ``max_batch_size`` sequences of
``max_seq_len`` tokens, as :class:`~torch_tensorrt_dist.generation.runner.ModelRunner` sizes it.

Order of writes: every rank loads its shard (as ``torchtrt-dist compile``: the family's spec);
rank 0 checks the output directory and removes an old ``manifest.json``; every rank writes its
files (each through a temporary name and a rename) and ``rank-R/rank.json`` (its entry); only
when every rank has succeeded does rank 0 write the manifest (listing ``rank.json`` too, sealed
with its digest). Each of these steps ends in a verdict of all ranks (``runtime.agree``): a rank
that fails stops every rank with its error instead of leaving them in a barrier. A compile that
crashes midway leaves no manifest, and loading refuses the directory.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from torch_tensorrt_dist.artifacts.build import (
    DEFAULT_MAX_SEQ,
    DEFAULT_ROWS,
    CompileResult,
    build_rank,
    check_artifact_quantization,
    check_output_dir,
    copy_tokenizer,
    read_rank,
)
from torch_tensorrt_dist.artifacts.fingerprint import args_hash, checkpoint_hash, running_versions
from torch_tensorrt_dist.artifacts.graphs import GraphEntry, step_graphs
from torch_tensorrt_dist.artifacts.manifest import (
    MANIFEST_NAME,
    GroupEntry,
    Manifest,
    write_manifest,
)
from torch_tensorrt_dist.config.jobs import CompileJob
from torch_tensorrt_dist.config.run import CacheOptions, Layout, ModelOptions, Parallel, RunConfig
from torch_tensorrt_dist.errors import ArtifactError, ConfigError
from torch_tensorrt_dist.families.spec import ModelPlan, Rank, check_kv_cache
from torch_tensorrt_dist.generation.runner import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_PREFILL_TOKENS,
    ModelRunner,
)
from torch_tensorrt_dist.models.dtypes import DTYPES, dtype_name
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.quantization import QuantConfig
from torch_tensorrt_dist.runtime.agree import agreed

__all__ = ["check_compile", "compile_artifacts", "write_artifacts"]

logger = logging.getLogger(__name__)


def check_compile(config: RunConfig, plan: ModelPlan) -> tuple[int, int]:
    """What a compile refuses before any weight is read (the launching process and every rank
    check it): the engine, the quantization, a KV-cache memory that cannot hold one sequence.
    Returns (rows, sequence length): ``--max-batch-size`` (default 8) and ``--max-seq-len``
    (default 256, at most the model's positions)."""
    if config.engine != "inductor":
        raise ConfigError(
            f"--engine {config.engine}: TensorRT artifacts are not built yet (a TensorRT engine "
            "freezes the KV-cache buffers; they must become engine inputs first); use --engine "
            "inductor"
        )
    check_artifact_quantization(config.quantize)
    rows = config.cache.max_batch_size or DEFAULT_ROWS
    cache_len = config.cache.max_seq_len or min(plan.args.max_seq_len, DEFAULT_MAX_SEQ)
    check_kv_cache(config, plan, rows, cache_len)
    return rows, cache_len


def write_artifacts(
    rank: Rank,
    net: Transformer,
    *,
    wrapper_opt_level: str = "O1",
    started: float | None = None,
) -> CompileResult:
    """Compile this rank's loaded (and quantized) shard ``net`` into the job's ``out``: call on
    every rank (TP over the whole world); rank 0 writes the manifest last."""
    start = time.perf_counter() if started is None else started
    config, plan = rank.config, rank.plan
    rows, cache_len = check_compile(config, plan)
    job = config.job
    if not isinstance(job, CompileJob):
        raise ConfigError(f"{config.command} does not write artifacts")
    root, cache = Path(job.out), config.cache
    # every step a rank does alone ends in a verdict of all ranks (runtime.agree): a rank that
    # fails stops every rank with its error, and no rank waits for it in a collective
    with agreed("creating the output directory"):
        if rank.index == 0:
            check_output_dir(root)
            root.mkdir(parents=True, exist_ok=True)
            (root / MANIFEST_NAME).unlink(missing_ok=True)  # the old set is no longer complete
    # each rank writes its files and rank.json; rank 0 reads every entry back from disk
    with agreed("writing the artifacts"):  # every rank's files and rank.json are in place
        # the checkpoint path's runner, uncompiled: its pool (set up on the model) and its
        # step limits are what the graphs are built for
        runner = ModelRunner(
            net,
            max_batch_size=rows,
            cache_len=cache_len,
            kv_cache_memory=cache.kv_cache_memory,
            block_size=cache.block,
            max_prefill_tokens=cache.prefill_budget,
        )
        graphs = step_graphs(runner.limits)
        build_rank(net, root, rank.index, graphs, wrapper_opt_level)
    manifest_path = root / MANIFEST_NAME
    with agreed("writing the manifest"):  # nobody returns before the manifest exists
        if rank.index == 0:
            write_manifest(root, _manifest(rank, root, runner, graphs))
            logger.info("wrote %s", manifest_path)
    if not manifest_path.is_file():
        raise ArtifactError(f"rank 0 did not write {manifest_path}")
    return CompileResult(manifest_path, time.perf_counter() - start)


def _manifest(rank: Rank, root: Path, runner: ModelRunner, graphs: list[GraphEntry]) -> Manifest:
    config, plan, world, group = rank.config, rank.plan, rank.world, rank.group
    path, args = plan.path, plan.args
    return Manifest(
        engine=config.engine,
        world_size=world,
        tp=world,
        pp=1,
        groups=[GroupEntry(group.group_name, list(range(world)), "tp")] if group else [],
        ranks=[read_rank(root, r) for r in range(world)],
        dtype=config.model.dtype,
        max_batch_size=runner.max_batch_size,
        cache_len=runner.cache_len,
        block_size=runner.block_size,
        num_blocks=runner.num_blocks,
        max_prefill_tokens=runner.max_prefill_tokens,
        graphs=graphs,
        model_args=asdict(args),
        checkpoint={
            "source": str(path.resolve()) if path is not None else f"preset:{plan.preset}",
            "sha256": checkpoint_hash(path) if path is not None else args_hash(args, 0),
        },
        options={"lm_head": config.model.lm_head, "embedding": config.model.embedding},
        tokenizer=copy_tokenizer(path, root),
        versions=running_versions(),
        device=torch.device(rank.device).type,
        quantization=None if config.quantize is None else config.quantize.to_dict(),
    )


def compile_artifacts(
    model: str | Path | None,
    out: str | Path,
    *,
    engine: str = "inductor",
    dtype: torch.dtype = torch.float32,
    max_seq_len: int | None = None,
    max_batch_size: int | None = None,
    kv_cache_memory: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
    lm_head: Layout = "vocab_parallel",
    embedding: Layout = "vocab_parallel",
    pp: int = 1,
    wrapper_opt_level: str = "O1",
    quantize: QuantConfig | None = None,
) -> CompileResult:
    """Compile this rank's graphs into ``out``; call on every rank (TP over the whole world).

    ``model``: a checkpoint directory or a preset name (random weights, seed 0), read and
    loaded as ``torchtrt-dist compile`` does (the dense family's spec). ``max_seq_len``
    (default 256), ``max_batch_size`` (default 8), ``kv_cache_memory`` (bytes of KV cache per
    rank; default: ``max_batch_size`` sequences of ``max_seq_len`` tokens), ``block_size``,
    ``max_prefill_tokens``: as for :class:`~torch_tensorrt_dist.generation.runner.ModelRunner`; the
    manifest records them and loading runs with them.
    ``quantize``: weight-only quantization of this rank's shard before export (the codes and
    scales are what ``weights.safetensors`` holds; the manifest records the scheme).
    ``wrapper_opt_level``: see :func:`inductor.compile_graph` (the tests use ``O0``).
    """
    from torch_tensorrt_dist.families import checkpoint_spec

    start = time.perf_counter()
    name = dtype_name(dtype)
    if name is None:
        raise ConfigError(f"dtype {dtype} is not one of {', '.join(DTYPES)}")
    world = dist.get_world_size() if dist.is_initialized() else 1
    config = RunConfig(
        "compile",
        ModelOptions(
            None if model is None else str(model), dtype=name, lm_head=lm_head, embedding=embedding
        ),
        Parallel(tp=world, pp=pp),
        CompileJob(str(out)),
        engine=engine,
        quantize=quantize,
        cache=CacheOptions(
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            kv_cache_memory=kv_cache_memory,
            block_size=block_size,
            max_prefill_tokens=max_prefill_tokens,
        ),
    )
    spec = checkpoint_spec(config)
    plan = spec.plan(config)
    check_compile(config, plan)
    cuda = torch.cuda.is_available()
    rank = Rank(
        config,
        spec,
        plan,
        index=dist.get_rank() if dist.is_initialized() else 0,
        world=world,
        device=torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"),
        group=dist.group.WORLD if world > 1 else None,
    )
    with agreed("loading the checkpoint"):
        net = rank.model()
    return write_artifacts(rank, net, wrapper_opt_level=wrapper_opt_level, started=start)
