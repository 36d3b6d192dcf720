"""Compile once: every rank builds and writes its graphs and weight shard; rank 0 the manifest.

    torchrun --nproc-per-node 2 -m torch_tensorrt_dist compile --model PATH --out DIR
    # or, on every rank of an initialised world:
    compile_artifacts("PATH", "DIR", max_seq_len=256, max_batch_size=8, kv_cache_memory=1 << 30)

The pool of KV blocks is part of what is compiled (its size is a constant of the graphs):
``kv_cache_memory`` bytes per rank, or room for ``max_batch_size`` sequences of
``max_seq_len`` tokens, as :class:`~torch_tensorrt_dist.generation.runner.ModelRunner` sizes it.

Order of writes: every rank loads its shard (as ``torchtrt-dist compile``: the family's spec,
``families/``); rank 0 checks the output directory and removes an old ``manifest.json``; every
rank writes its files (each through a temporary name and a rename) and ``rank-R/rank.json``
(its entry); only when every rank has succeeded does rank 0 write the manifest (listing
``rank.json`` too, sealed with its digest). Each of these steps ends in a verdict of all ranks
(``runtime.agree``): a rank that fails stops every rank with its error instead of leaving them
in a barrier. A compile that crashes midway leaves no manifest, and loading refuses the
directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from torch_tensorrt_dist.artifacts import inductor
from torch_tensorrt_dist.artifacts.fingerprint import args_hash, checkpoint_hash, running_versions
from torch_tensorrt_dist.artifacts.graphs import GraphEntry, step_graphs
from torch_tensorrt_dist.artifacts.manifest import (
    MANIFEST_NAME,
    FileEntry,
    GroupEntry,
    Manifest,
    RankEntry,
    atomic_write_bytes,
    sha256_file,
    write_manifest,
)
from torch_tensorrt_dist.config.jobs import CompileJob
from torch_tensorrt_dist.config.run import CacheOptions, Layout, ModelOptions, Parallel, RunConfig
from torch_tensorrt_dist.errors import ArtifactError, ConfigError
from torch_tensorrt_dist.families.spec import ModelPlan, Rank
from torch_tensorrt_dist.generation.runner import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_PREFILL_TOKENS,
    ModelRunner,
)
from torch_tensorrt_dist.models.dtypes import DTYPES, dtype_name
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.quantization import QuantConfig
from torch_tensorrt_dist.runtime.agree import agreed

__all__ = [
    "CompileResult",
    "check_artifact_quantization",
    "check_compile",
    "check_output_dir",
    "compile_artifacts",
    "write_artifacts",
]

logger = logging.getLogger(__name__)

#: The role under which a rank's ``rank.json`` is listed in the manifest.
ENTRY_ROLE = "entry"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",  # the chat template, where transformers saved it apart
)


@dataclass
class CompileResult:
    manifest: Path
    seconds: float
    """Wall time of this rank's compile (load, export, compile, write)."""


#: The sequence length compiled where ``--max-seq-len`` is not given (at most the model's).
DEFAULT_MAX_SEQ = 256
#: The rows compiled where ``--max-batch-size`` is not given (as ``serve``'s default).
DEFAULT_ROWS = 8


def check_artifact_quantization(quantize: QuantConfig | None) -> None:
    """Artifacts take int8 weights; int4 is refused with the reason."""
    if quantize is not None and quantize.scheme == "int4":
        raise ConfigError(
            "compile --quantize int4: AOTInductor gives every CPU int4 matmul a constant of its "
            "own (the group size), which packages built without their constants cannot load; "
            "compile with --quantize int8, or run generate --quantize int4 from the checkpoint"
        )


_ARTIFACT_ENTRY = re.compile(r"^(manifest\.json|tokenizer|rank-\d+|\..*\.tmp)$")


def check_output_dir(out: str | Path) -> None:
    """``out`` can receive artifacts: a directory (or a path that can become one) that this
    user can write, empty or holding artifacts only (a compile overwrites them). Checked by the
    launching process before any rank starts; raises :class:`ArtifactError`."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ArtifactError(
            f"the output path {root} is a file, not a directory; choose a new or empty directory"
        )
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ArtifactError(
            f"the output path {root} cannot be created: {existing} is a file, not a directory"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArtifactError(
            f"the output path {root} cannot be written: {existing} is not writable by this user "
            "(or is on a read-only file system); choose a writable place"
        )
    if root.is_dir():
        foreign = sorted(p.name for p in root.iterdir() if not _ARTIFACT_ENTRY.match(p.name))
        if foreign:
            shown = ", ".join(foreign[:3]) + (
                f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            )
            raise ArtifactError(
                f"the output directory {root} is not empty and is not an artifact directory (it "
                f"holds {shown}); choose a new or empty directory, or one written by "
                "`torchtrt-dist compile`, which a compile overwrites"
            )


def _entry(root: Path, path: Path) -> FileEntry:
    return FileEntry(str(path.relative_to(root)), sha256_file(path), path.stat().st_size)


def _save_weights(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save

    cpu = {k: v.to("cpu") for k, v in tensors.items()}
    atomic_write_bytes(path, save(cpu))


def _copy_tokenizer(src: Path | None, root: Path) -> dict[str, FileEntry] | None:
    if src is None or not (src / "tokenizer.json").is_file():
        return None
    out: dict[str, FileEntry] = {}
    for name in (*TOKENIZER_FILES, "config.json"):
        if (src / name).is_file():
            dest = root / "tokenizer" / name
            atomic_write_bytes(dest, (src / name).read_bytes())
            out[name] = _entry(root, dest)
    return out


def _build_rank(
    model: Transformer, root: Path, rank: int, graphs: list[GraphEntry], wrapper_opt_level: str
) -> RankEntry:
    rank_dir = root / f"rank-{rank}"
    if rank_dir.exists():
        shutil.rmtree(rank_dir)
    rank_dir.mkdir(parents=True)
    files: dict[str, FileEntry] = {}
    schedules: dict[str, list[str]] = {}
    head_group = inductor.detach_head_group(model)
    for graph in graphs:
        ep, schedule = inductor.export_step(model, graph, head_group=head_group)
        path = rank_dir / f"{graph.role}.pt2"
        secs = inductor.compile_graph(ep, path, wrapper_opt_level=wrapper_opt_level)
        logger.info("rank %d: compiled %s in %.1f s", rank, graph.role, secs)
        files[graph.role], schedules[graph.role] = _entry(root, path), schedule
    saved, state = inductor.constants_of(model)
    _save_weights(rank_dir / "weights.safetensors", saved)
    files["weights"] = _entry(root, rank_dir / "weights.safetensors")
    entry = RankEntry(rank=rank, files=files, schedules=schedules, state=state)
    atomic_write_bytes(rank_dir / "rank.json", json.dumps(asdict(entry)).encode())
    return entry


def _read_rank(root: Path, rank: int) -> RankEntry:
    """A rank's entry as it wrote it, with ``rank.json`` itself listed (role ``entry``)."""
    path = root / f"rank-{rank}" / "rank.json"
    data = json.loads(path.read_text())
    files = {k: FileEntry(**f) for k, f in data["files"].items()}
    return RankEntry(
        rank=data["rank"],
        files={**files, ENTRY_ROLE: _entry(root, path)},
        schedules=data["schedules"],
        state=data["state"],
    )


def check_compile(config: RunConfig, plan: ModelPlan) -> tuple[int, int]:
    """What a compile refuses before any weight is read (the launching process and every rank
    check it): the engine, the quantization, a KV-cache memory that cannot hold one sequence.
    Returns (rows, sequence length): ``--max-batch-size`` (default 8) and ``--max-seq-len``
    (default 256, at most the model's positions)."""
    from torch_tensorrt_dist.families.spec import check_kv_cache

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
        _build_rank(net, root, rank.index, graphs, wrapper_opt_level)
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
        ranks=[_read_rank(root, r) for r in range(world)],
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
        tokenizer=_copy_tokenizer(path, root),
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
