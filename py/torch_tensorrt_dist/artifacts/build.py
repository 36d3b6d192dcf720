"""Compile once: every rank builds and writes its graphs and weight shard; rank 0 the manifest.

    torchrun --nproc-per-node 2 -m torch_tensorrt_dist compile --model PATH --out DIR
    # or, on every rank of an initialised world:
    compile_artifacts("PATH", "DIR", max_seq_len=256, max_batch_size=8, kv_cache_memory=1 << 30)

The pool of KV blocks is part of what is compiled (its size is a constant of the graphs):
``kv_cache_memory`` bytes per rank, or room for ``max_batch_size`` sequences of
``max_seq_len`` tokens, as :class:`~torch_tensorrt_dist.generation.Generator` sizes it.

Order of writes: rank 0 first checks the output directory and removes an old
``manifest.json``; every rank loads its shard, then writes its files (each through a temporary
name and a rename) and ``rank-R/rank.json`` (its entry); only when every rank has succeeded
does rank 0 write the manifest (listing ``rank.json`` too, sealed with its digest). Each of
these steps ends in a verdict of all ranks (``runtime.agree``): a rank that fails stops every
rank with its error instead of leaving them in a barrier. A compile that crashes midway leaves
no manifest, and loading refuses the directory.
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
from torch_tensorrt_dist.errors import ArtifactError, ConfigError
from torch_tensorrt_dist.generation.generate import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_PREFILL_TOKENS,
    Generator,
)
from torch_tensorrt_dist.generation.kv_memory import kv_layout_for
from torch_tensorrt_dist.models.llama import PRESETS, ModelArgs, Transformer
from torch_tensorrt_dist.parallel.llama import Embedding, LMHead
from torch_tensorrt_dist.quantization import QuantConfig, check_group_slices, quantize_model
from torch_tensorrt_dist.runtime.agree import agreed

__all__ = [
    "CompileResult",
    "cache_len_for",
    "check_artifact_quantization",
    "check_output_dir",
    "check_pool",
    "compile_artifacts",
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
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class CompileResult:
    manifest: Path
    seconds: float
    """Wall time of this rank's compile (load, export, compile, write)."""


#: The sequence length compiled where ``max_seq_len`` is not given (at most the model's).
DEFAULT_MAX_SEQ = 256


def cache_len_for(args: ModelArgs, max_seq_len: int | None) -> int:
    """The compiled sequence length: ``max_seq_len`` (default 256), at most the model's."""
    return min(args.max_seq_len, max_seq_len or DEFAULT_MAX_SEQ)


def check_pool(
    args: ModelArgs,
    *,
    tp: int,
    dtype: torch.dtype,
    block_size: int,
    kv_cache_memory: int | None,
    max_batch_size: int,
    cache_len: int,
) -> int:
    """The pool's block count on each rank (ConfigError where ``kv_cache_memory`` cannot hold
    one sequence of ``cache_len`` tokens): what a compile will build, known before any rank
    starts."""
    layout = kv_layout_for(args, tp=tp, dtype=dtype, block_size=block_size)
    return layout.blocks_for_memory(kv_cache_memory, rows=max_batch_size, max_seq_len=cache_len)


def resolve_model(model: str | Path | None) -> tuple[Path | None, str | None]:
    """(checkpoint directory, None) or (None, preset name); None means the demo checkpoint,
    or the ``tiny`` preset where the demo is not installed."""
    if model is None:
        try:
            from torch_tensorrt_dist.models.demo import demo_checkpoint_path

            return demo_checkpoint_path(), None
        except (ImportError, ConfigError):
            return None, "tiny"
    if Path(model).is_dir():
        return Path(model), None
    if str(model) in PRESETS:
        return None, str(model)
    raise ConfigError(
        f"model {str(model)!r} is neither a checkpoint directory nor a preset "
        f"({', '.join(sorted(PRESETS))})"
    )


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


def _load(
    path: Path | None,
    preset: str | None,
    args: ModelArgs,
    group: dist.ProcessGroup | None,
    dtype: torch.dtype,
    device: torch.device,
    lm_head: LMHead,
    embedding: Embedding,
    preset_seed: int,
) -> Transformer:
    """This rank's shard of the checkpoint, or of a preset with random weights."""
    from torch_tensorrt_dist.models.loader import load_llama, random_llama

    if path is None:
        net = random_llama(
            args, seed=preset_seed, group=group, dtype=dtype, lm_head=lm_head, embedding=embedding
        )
        return net.to(device)
    return load_llama(
        path,
        group=group,
        dtype=dtype,
        device=device,
        lm_head=lm_head,
        embedding=embedding,
        max_seq_len=args.max_seq_len,
        progress=False,
    )


def compile_artifacts(
    model: str | Path | None,
    out: str | Path,
    *,
    engine: str = "inductor",
    dtype: torch.dtype = torch.float32,
    max_seq_len: int | None = None,
    max_batch_size: int = 8,
    kv_cache_memory: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
    pp: int = 1,
    preset_seed: int = 0,
    wrapper_opt_level: str = "O1",
    quantize: QuantConfig | None = None,
) -> CompileResult:
    """Compile this rank's graphs into ``out``; call on every rank (TP over the whole world).

    ``model``: a checkpoint directory or a preset name (random weights from ``preset_seed``).
    ``max_seq_len`` (default 256), ``max_batch_size``, ``kv_cache_memory`` (bytes of KV cache
    per rank; default: ``max_batch_size`` sequences of ``max_seq_len`` tokens), ``block_size``,
    ``max_prefill_tokens``: as for :class:`~torch_tensorrt_dist.generation.Generator`; the
    manifest records them and loading runs with them.
    ``quantize``: weight-only quantization of this rank's shard before export (the codes and
    scales are what ``weights.safetensors`` holds; the manifest records the scheme).
    ``wrapper_opt_level``: see :func:`inductor.compile_graph` (the tests use ``O0``).
    """
    from torch_tensorrt_dist.models.loader import read_config

    start = time.perf_counter()
    if pp != 1:
        raise ConfigError(
            f"compile --pp {pp}: pipeline artifacts are not supported yet; compile with --tp "
            "only (tensor parallel over every rank)"
        )
    if engine != "inductor":
        raise ConfigError(
            f"compile --engine {engine!r}: only inductor artifacts are built so far. TensorRT "
            "artifacts need the KV caches passed to the engines as inputs (a TensorRT engine "
            "freezes buffers), which the model does not do yet; use --engine inductor"
        )
    check_artifact_quantization(quantize)
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"dtype {dtype} is not one of {', '.join(DTYPE_NAMES.values())}")
    root = Path(out)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    group = dist.group.WORLD if world > 1 else None
    path, preset = resolve_model(model)
    args = read_config(path) if path is not None else ModelArgs.from_name(preset or "tiny")
    check_group_slices(args, tp=world, config=quantize)
    cache_len = cache_len_for(args, max_seq_len)
    # every step a rank does alone ends in a verdict of all ranks (runtime.agree): a rank that
    # fails stops every rank with its error, and no rank waits for it in a collective
    with agreed("creating the output directory"):
        if rank == 0:
            check_output_dir(root)
            root.mkdir(parents=True, exist_ok=True)
            (root / MANIFEST_NAME).unlink(missing_ok=True)  # the old set is no longer complete
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    with agreed("loading the checkpoint"):
        net = _load(path, preset, args, group, dtype, device, lm_head, embedding, preset_seed)
        if quantize is not None:
            quantize_model(net, quantize, engine="inductor")
        # the checkpoint path's generator, uncompiled: its pool (set up on the model) and its
        # step limits are what the graphs are built for
        gen = Generator(
            net,
            max_batch_size=max_batch_size,
            cache_len=cache_len,
            kv_cache_memory=kv_cache_memory,
            block_size=block_size,
            max_prefill_tokens=max_prefill_tokens,
        )
    graphs = step_graphs(gen.limits)
    # each rank writes its files and rank.json; rank 0 reads every entry back from disk
    with agreed("writing the artifacts"):  # every rank's files and rank.json are in place
        _build_rank(net, root, rank, graphs, wrapper_opt_level)
    manifest_path = root / MANIFEST_NAME
    with agreed("writing the manifest"):  # nobody returns before the manifest exists
        if rank == 0:
            manifest = Manifest(
                engine=engine,
                world_size=world,
                tp=world,
                pp=1,
                groups=[GroupEntry(group.group_name, list(range(world)), "tp")] if group else [],
                ranks=[_read_rank(root, r) for r in range(world)],
                dtype=DTYPE_NAMES[dtype],
                max_batch_size=max_batch_size,
                cache_len=cache_len,
                block_size=block_size,
                num_blocks=gen.num_blocks,
                max_prefill_tokens=gen.max_prefill_tokens,
                graphs=graphs,
                model_args=asdict(args),
                checkpoint={
                    "source": str(path.resolve()) if path is not None else f"preset:{preset}",
                    "sha256": checkpoint_hash(path)
                    if path is not None
                    else args_hash(args, preset_seed),
                },
                options={"lm_head": lm_head, "embedding": embedding},
                tokenizer=_copy_tokenizer(path, root),
                versions=running_versions(),
                device=device.type,
                quantization=None if quantize is None else quantize.to_dict(),
            )
            write_manifest(root, manifest)
            logger.info("wrote %s", manifest_path)
    if not manifest_path.is_file():
        raise ArtifactError(f"rank 0 did not write {manifest_path}")
    return CompileResult(manifest_path, time.perf_counter() - start)
