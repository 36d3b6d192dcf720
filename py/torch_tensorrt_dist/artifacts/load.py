"""Run many: a rank starts from its artifacts (no checkpoint, no compile) and generates.

    gen = load_generator("DIR")        # on every rank, after init_distributed()
    result = gen.generate(prompts, max_new_tokens=32)

Before any collective runs, the rank checks, in this order: the manifest is complete and of
this format; the world size and layout are the compiled ones; the software versions that the
packages depend on match; every recorded process group exists here under the same name with
the same ranks (graphs call collectives by group name); its own files (``rank.json`` too) and
the tokenizer files match their sha256. It then loads its shard and graphs, and only when every
rank has passed all of that (one exchange through the c10d store) does any rank go on; a rank's
refusal stops every rank with its message. The weights come from the rank's safetensors shard
(no pickle), the graphs from their packages, and the KV block pools start as zeros of the
compiled size; :class:`ArtifactRunner` is a runner whose step runs those graphs, and the
:class:`Generator` over it is the checkpoint path's (``generate``, ``core()``, ``scheduler()``,
``warmup_all()``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from torch_tensorrt_dist.artifacts.checks import (
    check_device,
    check_layout,
    check_length,
    check_versions,
)
from torch_tensorrt_dist.artifacts.fingerprint import running_versions
from torch_tensorrt_dist.artifacts.graphs import limits_of, pick_graph
from torch_tensorrt_dist.artifacts.manifest import Manifest, read_manifest, verify_files
from torch_tensorrt_dist.errors import ArtifactError
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.generation.kv_memory import KVLayout, format_bytes, kv_layout_for
from torch_tensorrt_dist.generation.runner import StepFn, StepRunner
from torch_tensorrt_dist.models.dtypes import DTYPES
from torch_tensorrt_dist.models.llama_args import ModelArgs, RopeScaling
from torch_tensorrt_dist.ops.groups import check_group_ranks
from torch_tensorrt_dist.runtime.agree import agreed
from torch_tensorrt_dist.runtime.huge_pages import huge_page_tensors

__all__ = [
    "ArtifactRunner",
    "check_groups",
    "check_options",
    "kv_layout_of",
    "load_generator",
    "model_args",
    "open_artifacts",
    "read_weights",
]

logger = logging.getLogger(__name__)


def model_args(manifest: Manifest) -> ModelArgs:
    data = dict(manifest.model_args)
    scaling = data.pop("rope_scaling", None)
    data["eos_token_ids"] = tuple(data.get("eos_token_ids", ()))
    return ModelArgs(**data, rope_scaling=None if scaling is None else RopeScaling(**scaling))


def check_groups(manifest: Manifest) -> None:
    """Every recorded group resolves, by its name, to its recorded ranks (no collective)."""
    for group in manifest.groups:
        if not dist.is_initialized():
            raise ArtifactError(
                f"the artifacts call collectives on group {group.name!r} (ranks {group.ranks}), "
                "but torch.distributed is not initialised; launch "
                f"{manifest.world_size} ranks (torchtrt-dist generate --artifacts starts them)"
            )
        try:
            check_group_ranks(group.name, group.ranks)
        except Exception as exc:
            raise ArtifactError(
                f"process group {group.name!r} ({group.role}) of the artifacts: {exc}"
            ) from exc


@dataclass
class Opened:
    """A checked manifest and this rank's place in it."""

    root: Path
    manifest: Manifest
    rank: int


def open_artifacts(root: str | Path, *, tp: int | None = None, pp: int | None = None) -> Opened:
    """Read and check the manifest and this rank's files (every refusal of this rank; no
    collective, no exchange with the other ranks: :func:`load_generator` does that)."""
    path = Path(root)
    manifest = read_manifest(path)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    check_layout(manifest, world_size=world, tp=tp, pp=pp)
    check_versions(manifest, running_versions())
    check_groups(manifest)
    verify_files(path, manifest.rank_entry(rank).files)
    if manifest.tokenizer:
        verify_files(path, manifest.tokenizer)
    return Opened(path, manifest, rank)


def kv_layout_of(manifest: Manifest) -> KVLayout:
    """The KV-cache layout of each rank of the artifacts (bytes per block)."""
    dtype = DTYPES[manifest.dtype]
    return kv_layout_for(
        model_args(manifest), tp=manifest.tp, dtype=dtype, block_size=manifest.block_size
    )


def check_options(manifest: Manifest, given: Mapping[str, int | None]) -> None:
    """Run options (``max_batch_size``, ``max_seq_len``, ``kv_cache_memory``, ``block_size``,
    ``max_prefill_tokens``; None: not given) equal the compiled ones, else
    :class:`ArtifactError` with the fix. The pool's size and the step's ranges are constants
    of the graphs; a ``kv_cache_memory`` that buys the compiled pool is accepted."""
    compiled = {
        "max_batch_size": (manifest.max_batch_size, f"{manifest.max_batch_size} rows"),
        "max_seq_len": (manifest.cache_len, f"sequences of {manifest.cache_len} tokens"),
        "block_size": (manifest.block_size, f"blocks of {manifest.block_size} tokens"),
        "max_prefill_tokens": (
            manifest.max_prefill_tokens,
            f"{manifest.max_prefill_tokens} prompt tokens per step",
        ),
    }
    for name, value in given.items():
        if value is None:
            continue
        option = "--" + name.replace("_", "-")
        if name == "kv_cache_memory":
            layout = kv_layout_of(manifest)
            blocks = layout.blocks_for_memory(
                value, rows=manifest.max_batch_size, max_seq_len=manifest.cache_len
            )
            if blocks != manifest.num_blocks:
                have = (manifest.num_blocks - 1) * layout.bytes_per_block
                raise ArtifactError(
                    f"{option} {value} ({format_bytes(value)}) makes a pool of {blocks} blocks, "
                    f"but the artifacts were compiled with {manifest.num_blocks} "
                    f"({format_bytes(have)} of KV cache per rank; the pool is part of the "
                    f"graphs); leave it unset, or recompile with `torchtrt-dist compile "
                    f"{option} {value}`"
                )
            continue
        if name not in compiled:
            raise ValueError(f"check_options: unknown option {name!r}")
        want, described = compiled[name]
        if value != want:
            raise ArtifactError(
                f"{option} {value}: the artifacts were compiled for {described}; leave it unset "
                f"or recompile with `torchtrt-dist compile {option} {value}`"
            )


class ArtifactRunner(StepRunner):
    """A runner over loaded graphs: its step runs the compiled graph that takes the call's
    rows, tokens and blocks (``graphs.pick_graph``); the pool and limits are the manifest's.
    Requests are checked against the compiled sequence length."""

    def __init__(
        self,
        manifest: Manifest,
        graphs: Mapping[str, StepFn],
        *,
        device: torch.device,
        constants: dict[str, Tensor] | None = None,
    ) -> None:
        missing = sorted({g.role for g in manifest.graphs} - set(graphs))
        if missing:
            raise ArtifactError(f"the graphs {missing} of the manifest were not loaded; recompile")
        self.manifest = manifest
        self.constants = constants or {}  # the graphs read these tensors in place: keep them
        self.args = model_args(manifest)
        self.moe = None  # the manifest records no experts: chunks sized as for a dense MLP
        self.engine = f"artifacts:{manifest.engine}"
        self.max_batch_size = manifest.max_batch_size
        self.cache_len = manifest.cache_len
        self.max_prefill_tokens = manifest.max_prefill_tokens
        self.block_size, self.num_blocks = manifest.block_size, manifest.num_blocks
        self.layout = kv_layout_of(manifest)
        self.device = device
        self.limits = limits_of(manifest.graphs, manifest.block_size)
        self._graphs = dict(graphs)
        self.step = self._run_graph
        self.mark_dynamic = False  # packages: nothing traces the step (no Dynamo import)
        self.pack = False  # the graphs take the step's rows unpacked

    def _run_graph(
        self, tokens: Tensor, start: Tensor, last: Tensor, past: Tensor, dest: Tensor
    ) -> Tensor:
        r, s = tokens.shape
        graph = pick_graph(self.manifest.graphs, rows=r, tokens=s, blocks=past.shape[1])
        return self._graphs[graph.role](tokens, start, last, past, dest)

    def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
        if max_new_tokens >= 1:  # the length, named as compiled; the rest as from a checkpoint
            check_length(self.manifest, max((len(p) for p in prompts), default=0), max_new_tokens)
        return super().check(prompts, max_new_tokens)


def read_weights(path: Path, device: torch.device) -> dict[str, Tensor]:
    """A rank's ``weights.safetensors`` (no pickle), each tensor read into its own allocation:
    ``safetensors.torch.load_file`` returns views of one buffer at the file's offsets, and
    torch's int8 weight-only CPU kernel crashes on a weight that is not 64-byte aligned."""
    from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader

    with SafetensorsReader(path) as reader:
        return {k: reader.read(k).to(device) for k in reader.keys()}  # noqa: SIM118


def load_generator(
    root: str | Path,
    *,
    tp: int | None = None,
    pp: int | None = None,
    device: torch.device | str | None = None,
    prefix_caching: bool = True,
    salt: bytes = b"",
) -> Generator:
    """Check the artifacts, load this rank's shard and graphs, return a ready generator.

    Every rank checks and loads its own part, then the ranks agree (``runtime.agree``): if any
    rank refused or failed, every rank raises before any graph runs, the others with a
    :class:`RankFailedError` quoting that rank's message. ``prefix_caching``: reuse the full
    blocks of earlier prompts (a property of the run, not of the artifacts); ``salt``: the
    model's identity in prefix-cache keys."""
    start = time.perf_counter()
    with agreed("the artifact check"):
        runner = _load_runner(root, tp=tp, pp=pp, device=device)
    runner.load_s = time.perf_counter() - start
    logger.info(
        "rank %d: loaded the artifacts of %s in %.2f s",
        dist.get_rank() if dist.is_initialized() else 0,
        root,
        runner.load_s,
    )
    return Generator(runner, prefix_caching=prefix_caching, salt=salt)


def _load_runner(
    root: str | Path, *, tp: int | None, pp: int | None, device: torch.device | str | None
) -> ArtifactRunner:
    opened = open_artifacts(root, tp=tp, pp=pp)
    manifest, entry = opened.manifest, opened.manifest.rank_entry(opened.rank)
    dev = (
        torch.device(device)
        if device is not None
        else (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    )
    check_device(manifest, dev.type)
    constants = read_weights(opened.root / entry.files["weights"].path, dev)
    if dev.type == "cpu":  # each step streams the weights (runtime/huge_pages.py); not the state
        huge_page_tensors(constants.values())
    dtype = DTYPES[manifest.dtype]
    for name, shape in entry.state.items():
        constants[name] = torch.zeros(shape, dtype=dtype, device=dev)
    # the manifest lists a file for every graph on every rank (Manifest.check_consistent)
    paths = {g.role: opened.root / entry.files[g.role].path for g in manifest.graphs}
    from torch_tensorrt_dist.artifacts.inductor import load_graphs

    # open_artifacts has just checked each file against these hashes: not read twice
    digests = {g.role: entry.files[g.role].sha256 for g in manifest.graphs}
    graphs = load_graphs(paths, constants, dev, digests)
    return ArtifactRunner(manifest, graphs, device=dev, constants=constants)
