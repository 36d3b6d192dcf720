"""Build a transformers causal LM from its config, shard it by its own TP plan, and fill each
rank's slices with our safetensors reader (never a full read per rank).

    model = load_hf(path, cfg, group=tp_group, dtype=torch.float32)   # a PagedHFModel
    model.bytes_read                                                  # this rank's reads

The model class is transformers' (``AutoModelForCausalLM``'s for the ``model_type``), built with
its parameters on the meta device (its buffers, RoPE frequencies, computed as transformers
computes them) and our attention (``models/hf_attention.py``). Under ``tp`` > 1 the model is
sharded by its own ``base_model_tp_plan`` (``parallel/hf_shard.py``): each sharded parameter
becomes a DTensor whose local shard's place in the full tensor gives the slice read.

Checkpoint names follow transformers' load-time conversions (``conversion_mapping``) where the
class's names differ: its renamings, and experts stored one tensor per expert that the class
holds fused (:class:`Fused`: each expert's tensor read into its place in the fused one). The
checkpoint's stored buffers (a router's bias) are read too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.checkpoint_files import checkpoint_tensors
from torch_tensorrt_dist.models.hf_attention import PAGED_ATTENTION, register_paged_attention
from torch_tensorrt_dist.models.hf_config import causal_lm_class, kv_shape, model_args
from torch_tensorrt_dist.models.hf_model import PagedHFModel
from torch_tensorrt_dist.models.hf_stage import cut_hf_stage
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader
from torch_tensorrt_dist.models.stage import StageRole
from torch_tensorrt_dist.parallel.hf_shard import head_split, shard, shard_slice, untie

__all__ = ["Fused", "build_meta", "check_hf_checkpoint", "load_hf"]

logger = logging.getLogger(__name__)


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered meanwhile lands on the meta device; buffers stay real."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            meta = param.to("meta")
            module._parameters[name] = nn.Parameter(meta, requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_meta(cfg: Any, dtype: torch.dtype) -> Any:
    """transformers' causal LM of ``cfg`` in ``dtype``, parameters on the meta device, its
    attention ours."""
    from transformers.initialization import no_init_weights

    register_paged_attention()
    cls = causal_lm_class(cfg)
    with _parameters_on_meta(), no_init_weights():
        model = cls._from_config(cfg, attn_implementation=PAGED_ATTENTION, dtype=dtype)
    model.tie_weights()  # skipped by no_init_weights: a tied head shares the embedding again
    return model.eval().requires_grad_(False)


@dataclass(frozen=True)
class Fused:
    """A parameter transformers fuses at load time (its ``conversion_mapping``): each part's
    tensors (one per expert) stacked along dim 0, the parts concatenated along ``cat_dim``
    (deepseek_v3's ``experts.gate_up_proj`` [E, 2I, H] from ``experts.{e}.gate_proj.weight``
    and ``experts.{e}.up_proj.weight``)."""

    parts: tuple[tuple[str, ...], ...]
    cat_dim: int


#: where each parameter (and stored buffer) is read from: a checkpoint tensor, or a fused one
Source = str | Fused


def _conversions(model: nn.Module) -> tuple[list[tuple[str, str]], list[Any]]:
    """transformers' load-time conversions of ``model``'s class that this reader applies: the
    renamings (regex, target) and the expert merges (a ``MergeModulelist`` stack, then at most
    one ``Concatenate``). Other conversions are not applied (their tensor is refused by name)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        Concatenate,
        MergeModulelist,
        WeightConverter,
        WeightRenaming,
    )

    renames, merges = [], []
    for t in get_model_conversion_mapping(model):  # type: ignore[arg-type]
        src, tgt = t._original_source_patterns, t._original_target_patterns
        if type(t) is WeightRenaming and len(tgt) == 1:
            renames += [(pattern, tgt[0]) for pattern in src]
        elif isinstance(t, WeightConverter) and len(tgt) == 1:
            ops = [type(op) for op in t.operations]
            if ops in ([MergeModulelist], [MergeModulelist, Concatenate]):
                merges.append(t)
    return renames, merges


def _renamed(names: Any, renames: list[tuple[str, str]]) -> dict[str, str]:
    """Checkpoint name -> its name after transformers' renamings (only the changed ones)."""
    out = {}
    for name in names:
        new = name
        for pattern, target in renames:
            try:
                new = re.sub(pattern, target, new)
            except re.error:
                continue
        if new != name:
            out[new] = name
    return out


def _fused_source(
    name: str, shape: tuple[int, ...], merges: list[Any], renamed: dict[str, str]
) -> Fused | None:
    """The fused source of parameter ``name`` (shape [E, ...]) by one of ``merges``; its part
    names as the checkpoint stores them (before ``renamed``)."""
    from transformers.core_model_loading import Concatenate

    for t in merges:
        target = t._original_target_patterns[0].lstrip(".")
        if not name.endswith(target) or "*" not in "".join(t._original_source_patterns):
            continue
        prefix = name[: len(name) - len(target)]
        parts = tuple(
            tuple(
                renamed.get(n, n)
                for n in (prefix + src.lstrip(".").replace("*", str(e)) for e in range(shape[0]))
            )
            for src in t._original_source_patterns
        )
        cat = next((op.dim for op in t.operations if isinstance(op, Concatenate)), 0)
        return Fused(parts, cat)
    return None


def _expected(
    name: str, source: Fused, shape: tuple[int, ...], tensors: dict[str, tuple[Path, Any]]
) -> None:
    """Each part tensor of a fused parameter present with its share of the shape."""
    share = list(shape[1:])
    if len(source.parts) > 1:
        share[source.cat_dim - 1] //= len(source.parts)
    for part in source.parts:
        for tensor in part:
            if tensor not in tensors:
                raise CheckpointError(
                    f"lacks tensor {tensor!r} (one of the parts transformers fuses into {name!r})"
                )
            got = list(tensors[tensor][1].shape)
            if got != share:
                raise CheckpointError(
                    f"tensor {tensor!r} has shape {got}, but config.json implies {share} "
                    f"(its part of {name!r}); the config and weights do not match"
                )


def check_hf_checkpoint(
    path: Path, model: nn.Module
) -> tuple[dict[str, tuple[Path, Any]], dict[str, Source]]:
    """Every parameter of the (meta) model in the checkpoint with its full shape (the
    headers only: nothing read), and the checkpoint's stored buffers; CheckpointError naming
    the tensor otherwise. Returns the checkpoint's tensors and each name's source (renamed or
    fused as transformers' load-time conversions say)."""
    tensors = checkpoint_tensors(path)
    renames, merges = _conversions(model)
    renamed = _renamed(tensors, renames)
    sources: dict[str, Source] = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        stored = name if name in tensors else renamed.get(name)
        fused = _fused_source(name, shape, merges, renamed) if stored is None else None
        if fused is not None:
            try:
                _expected(name, fused, shape, tensors)
            except CheckpointError as exc:
                raise CheckpointError(f"{path}: {exc}") from None
            sources[name] = fused
            continue
        if stored is None:
            raise CheckpointError(
                f"{path} lacks tensor {name!r}: the checkpoint does not match its config.json "
                "(or stores the weight in another layout than transformers' model class)"
            )
        got = tuple(tensors[stored][1].shape)
        if got != shape:
            raise CheckpointError(
                f"{path}: tensor {stored!r} has shape {list(got)}, but config.json implies "
                f"{list(shape)}; the config and weights do not match"
            )
        sources[name] = stored
    for name, b in model.named_buffers():  # stored buffers (a router's bias): read whole
        stored = name if name in tensors else renamed.get(name)
        if stored is not None and tuple(tensors[stored][1].shape) == tuple(b.shape):
            sources[name] = stored
    return tensors, sources


def _aliases(model: nn.Module, sources: dict[str, Source]) -> dict[str, str]:
    """Each parameter name -> the parameter name whose source holds it (a tied head: the
    embedding's, which sharding may have given a tensor of its own)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    out = {}
    for names in by_id.values():
        stored = next((n for n in names if n in sources), names[0])
        out.update(dict.fromkeys(names, stored))
    return out


class _Readers:
    """One open reader per checkpoint file, and the bytes read through them."""

    def __init__(self, tensors: dict[str, tuple[Path, Any]]) -> None:
        self.tensors = tensors
        self.open: dict[Path, SafetensorsReader] = {}

    def read(
        self, out: torch.Tensor, name: str, dim: int | None = None, start: int = 0, stop: int = 0
    ) -> None:
        """Tensor ``name`` (or its slice) into ``out``: straight into its memory where the
        dtypes agree and ``out`` is contiguous, else through one temporary."""
        file = self.tensors[name][0]
        if file not in self.open:
            self.open[file] = SafetensorsReader(file)
        reader = self.open[file]
        stop_: int | None = stop if dim is not None else None
        if reader.info(name).dtype == out.dtype and out.is_contiguous():
            reader.read_into(out, name, dim, start, stop_)
        else:
            out.copy_(reader.read(name, dim, start, stop_))

    def close(self) -> int:
        total = sum(r.bytes_read for r in self.open.values())
        for r in self.open.values():
            r.close()
        return total


def _read(readers: _Readers, name: str, source: Source, p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of parameter ``name`` (a DTensor's local part, else the whole)."""
    shape, dim, start, stop = shard_slice(p)
    local = torch.empty(shape, dtype=p.dtype)
    if isinstance(source, str):
        readers.read(local, source, dim, start, stop)
        return local
    if dim is not None:
        raise CheckpointError(
            f"{name!r} is fused at load from per-expert tensors and split by the TP plan "
            f"(dim {dim}): this reader reads such a tensor whole only"
        )
    width = shape[source.cat_dim] // len(source.parts)
    for i, part in enumerate(source.parts):
        block = local.narrow(source.cat_dim, i * width, width)
        for e, tensor in enumerate(part):
            readers.read(block[e], tensor)
    return local


def _fill(
    model: nn.Module,
    sources: dict[str, Source],
    aliases: dict[str, str],
    tensors: dict[str, tuple[Path, Any]],
    device: torch.device | str,
) -> int:
    """Allocate every parameter's local shard and read it, and the stored buffers; returns
    the bytes read. A parameter two modules share (a tied head, roberta's head bias) is read
    once and stays shared."""
    from torch.distributed.tensor import DTensor

    readers = _Readers(tensors)
    filled: dict[int, nn.Parameter] = {}
    try:
        for param_name, _ in model.named_parameters(remove_duplicate=False):
            owner, _, attr = param_name.rpartition(".")
            module = model.get_submodule(owner)
            p = module._parameters[attr]
            assert p is not None
            if id(p) in filled:
                module._parameters[attr] = filled[id(p)]
                continue
            value = _read(readers, param_name, sources[aliases.get(param_name, param_name)], p)
            value = value.to(device)
            if isinstance(p, DTensor):
                value = DTensor.from_local(
                    value, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
                )
            module._parameters[attr] = filled[id(p)] = nn.Parameter(value, requires_grad=False)
        for buffer_name, b in list(model.named_buffers()):
            source = sources.get(buffer_name)
            if isinstance(source, str):
                owner, _, attr = buffer_name.rpartition(".")
                local = torch.empty(b.shape, dtype=b.dtype)
                readers.read(local, source)
                model.get_submodule(owner)._buffers[attr] = local.to(device)
    finally:
        total = readers.close()
    return total


def _retie(model: Any) -> None:
    """Tied weights (the LM head reading the embedding) point at the filled tensor again."""
    if getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        out, emb = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and hasattr(out, "weight") and hasattr(emb, "weight"):
            out.weight = emb.weight  # (not on a pipeline stage without the head)


def load_hf(
    path: str | Path,
    cfg: Any,
    *,
    group: dist.ProcessGroup | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    stage: StageRole | None = None,
) -> PagedHFModel:
    """This rank's shard of the checkpoint's transformers model, as a :class:`PagedHFModel`
    (``bytes_read``: the checkpoint bytes this rank read); ``stage``: only this pipeline
    stage's parts (``models/hf_stage.py``), the only tensors read."""
    root = Path(path)
    tp = 1 if group is None else dist.get_world_size(group)
    model = build_meta(cfg, dtype)
    if stage is not None:
        cut_hf_stage(model, stage)
    tensors, sources = check_hf_checkpoint(root, model)
    aliases = _aliases(model, sources)
    if tp > 1:  # a tied head gets its own shard (the head's split, not the embedding's)
        untie(model, aliases)
        shard(model, group, device)
    bytes_read = _fill(model, sources, aliases, tensors, device)
    if tp == 1:
        _retie(model)
    model.to(device)  # the buffers (RoPE frequencies)
    paged = PagedHFModel(model, model_args(cfg, tp=tp), kv_shape(cfg, tp=tp))
    if stage is not None:
        paged.stage = stage
    if tp > 1 and paged.stage.last and head_split(model):
        paged.group = group
    paged.bytes_read = bytes_read
    logger.info("loaded %s as transformers' %s (tp %d)", root, type(model).__name__, tp)
    return paged
