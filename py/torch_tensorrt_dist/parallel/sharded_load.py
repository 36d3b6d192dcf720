"""One loader for every native model family: build on the meta device -> the family's TP plan
-> cut a pipeline stage -> materialise -> fill each parameter with positioned reads of this
rank's slice of its checkpoint tensor.

    model = load_sharded(root, shards, dtype=torch.bfloat16, stage=role)
    model.bytes_read                      # the checkpoint bytes this rank read

A family says what differs in a :class:`Shards`: how its model is built, how its TP plan
shards it, and which checkpoint tensor (and which slice of it) fills each parameter. The rest
is here, alike for every family: the reads are listed on the meta model and checked against
the safetensors headers (every tensor present, every shape the one the config implies) before
any weight is allocated; then each file is opened once and every read goes straight into the
parameter's memory (``SafetensorsReader``, no memory map), so a rank reads only its slices and
the replicated tensors. :func:`random_sharded` is the same model with deterministic random
weights (the same on every rank) instead of a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.checkpoint_files import checkpoint_tensors
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader, TensorInfo
from torch_tensorrt_dist.models.stage import StageRole, cut_stage
from torch_tensorrt_dist.parallel.llama import ShardSlice

__all__ = [
    "Read",
    "Shards",
    "check_sharded",
    "checkpoint_dir",
    "load_into",
    "load_sharded",
    "param_reads",
    "random_sharded",
]


@dataclass(frozen=True)
class Read:
    """One positioned read: checkpoint tensor ``key`` (``base@e``: block ``e`` of a tensor
    stacked on its first dim), sliced by ``slice``, into ``dest``."""

    name: str
    """Our parameter (named in messages)."""
    dest: torch.Tensor
    key: str
    slice: ShardSlice | None
    shape: tuple[int, ...]
    """The checkpoint tensor's full shape that the config implies (per block for ``@``)."""


class Shards(Protocol):
    """What a family gives the loader."""

    def build(self) -> nn.Module:
        """The whole, unsharded model (the loader calls it under ``torch.device("meta")``)."""
        ...

    def shard(self, model: nn.Module) -> None:
        """Apply the family's TP plan in place (meta or real weights)."""
        ...

    def reads(
        self, model: nn.Module, names: dict[str, Path], full: dict[str, tuple[int, ...]]
    ) -> list[Read]:
        """Every parameter's read: ``names`` the checkpoint's tensor -> file map, ``full`` the
        unsharded shapes of the model's parameters (before :meth:`shard`)."""
        ...


def param_reads(
    model: nn.Module,
    full: dict[str, tuple[int, ...]],
    key_of: Callable[[str], str | None],
    slice_of: Callable[[str], ShardSlice | None],
) -> list[Read]:
    """The reads of every parameter that is one checkpoint tensor: ``key_of`` its checkpoint
    name (None: the family reads it otherwise), ``slice_of`` this rank's slice of it."""
    out = []
    for name, param in model.named_parameters():
        key = key_of(name)
        if key is not None:
            out.append(Read(name, param, key, slice_of(name), full[name]))
    return out


def load_into(
    param: torch.Tensor, reader: SafetensorsReader, name: str, sl: ShardSlice | None
) -> None:
    """Fill ``param`` with the tensor or its slice; straight into its memory when it can be."""
    dim, start, stop = (None, 0, None) if sl is None else (sl.dim, sl.start, sl.stop)
    rows = param
    if sl is not None and sl.padded > sl.stop - sl.start:
        # the last vocab shard: zero rows, sliced off after the gather
        param[sl.stop - sl.start :].zero_()
        rows = param[: sl.stop - sl.start]
    if rows.device.type == "cpu" and rows.dtype == reader.info(name).dtype:
        reader.read_into(rows, name, dim, start, stop)
    else:  # another dtype or device: one tensor-sized temporary
        rows.copy_(reader.read(name, dim, start, stop))


def _block(t: TensorInfo, key: str, where: str) -> TensorInfo:
    """Block ``e`` of ``base@e``: a [rest...] view of a tensor stacked on its first dim."""
    base, e = key.rsplit("@", 1)
    if not t.shape or not 0 <= int(e) < t.shape[0]:
        raise CheckpointError(f"{where}: tensor {base!r} of shape {list(t.shape)} has no block {e}")
    stride = (t.end - t.begin) // t.shape[0]
    begin = t.begin + int(e) * stride
    return TensorInfo(t.dtype, t.shape[1:], begin, begin + stride)


def _check_shape(where: str, key: str, have: tuple[int, ...], want: tuple[int, ...]) -> None:
    if have != want:
        blocks = " (per expert where experts are fused)" if "@" in key else ""
        raise CheckpointError(
            f"{where}: tensor {key.split('@')[0]!r} has shape {list(have)}, but config.json "
            f"implies {list(want)}{blocks}; the config and weights do not match"
        )


def check_reads(
    root: Path, headers: dict[str, tuple[Path, TensorInfo]], reads: Iterable[Read]
) -> None:
    """Every read's tensor in the headers with the shape the config implies (nothing read);
    CheckpointError naming the tensor otherwise."""
    for r in reads:
        base = r.key.split("@")[0]
        if base not in headers:
            raise CheckpointError(f"{root} lacks tensor {base!r} (for {r.name})")
        file, info = headers[base]
        if "@" in r.key:
            info = _block(info, r.key, file.name)
        _check_shape(file.name, r.key, tuple(info.shape), r.shape)


def _fill(root: Path, names: dict[str, Path], reads: list[Read], progress: bool) -> int:
    """Every read, file by file; returns the checkpoint bytes read."""
    by_file: dict[Path, list[Read]] = {}
    for r in reads:
        by_file.setdefault(names[r.key.split("@")[0]], []).append(r)
    show = progress and (not dist.is_initialized() or dist.get_rank() == 0)
    total = 0
    with (
        tqdm(total=len(reads), desc=f"loading {root.name}", disable=not show) as bar,
        torch.no_grad(),
    ):
        for file, entries in by_file.items():
            with SafetensorsReader(file) as reader:
                for r in entries:
                    if "@" in r.key and r.key not in reader.tensors:
                        base = reader.info(r.key.split("@")[0])
                        reader.tensors[r.key] = _block(base, r.key, file.name)
                    _check_shape(file.name, r.key, tuple(reader.info(r.key).shape), r.shape)
                    load_into(r.dest, reader, r.key, r.slice)
                    bar.update(1)
                total += reader.bytes_read
    return total


def _built(shards: Shards, stage: StageRole | None) -> tuple[nn.Module, dict[str, tuple[int, ...]]]:
    """The family's model on meta, sharded and cut to ``stage``; its unsharded shapes."""
    with torch.device("meta"):
        model = shards.build()
    full = {name: tuple(p.shape) for name, p in model.named_parameters()}
    shards.shard(model)
    if stage is not None:
        cut_stage(model, stage)
    return model, full


def checkpoint_dir(path: str | Path) -> Path:
    """``path`` as a directory; CheckpointError where there is none."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    return root


def check_sharded(root: Path, shards: Shards) -> None:
    """The family's whole model against the checkpoint's headers (every tensor, every shape):
    built on meta, nothing allocated, nothing read; CheckpointError naming the tensor."""
    headers = checkpoint_tensors(root)
    names = {name: file for name, (file, _) in headers.items()}
    model, full = _built(shards, None)
    check_reads(root, headers, shards.reads(model, names, full))


def load_sharded(
    path: str | Path,
    shards: Shards,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    stage: StageRole | None = None,
    progress: bool = True,
) -> nn.Module:
    """This rank's part of the checkpoint ``path``'s model (only a pipeline ``stage``'s parts
    when given); ``model.bytes_read``: the bytes read."""
    root = checkpoint_dir(path)
    headers = checkpoint_tensors(root)
    names = {name: file for name, (file, _) in headers.items()}
    model, full = _built(shards, stage)
    check_reads(root, headers, shards.reads(model, names, full))  # before any allocation
    model = model.to(dtype).to_empty(device=device)
    bytes_read = _fill(root, names, shards.reads(model, names, full), progress)
    model.bytes_read = bytes_read  # type: ignore[assignment]  # each family's model has one
    return model.requires_grad_(False).eval()


def random_sharded(
    shards: Shards,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    stage: StageRole | None = None,
) -> nn.Module:
    """The family's model with deterministic random weights (the same on every rank: norms 1,
    the rest N(0, 0.25 / fan-in)), then sharded and cut to ``stage`` (the whole model's
    weights, so a stage equals its part of it)."""
    gen = torch.Generator().manual_seed(seed)
    model = shards.build()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 / p.shape[-1] ** 0.5)
    shards.shard(model)
    if stage is not None:
        cut_stage(model, stage)
    return model.to(dtype).requires_grad_(False).eval()
