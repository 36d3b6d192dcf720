"""Build a transformers causal LM from its config, shard it by its own TP plan, and fill each
rank's slices with our safetensors reader (never a full read per rank).

    model = load_hf(path, cfg, group=tp_group, dtype=torch.float32)   # a PagedHFModel
    model.bytes_read                                                  # this rank's reads

The model class is transformers' (``AutoModelForCausalLM``'s for the ``model_type``), built with
its parameters on the meta device (its buffers, RoPE frequencies, computed as transformers
computes them) and our attention (``models/hf_attention.py``). Under ``tp`` > 1,
transformers' ``apply_tensor_parallelism`` applies the model's ``base_model_tp_plan``: each
sharded parameter becomes a DTensor whose local shard's place in the full tensor gives the
slice read (``compute_local_shape_and_global_offset``); its collectives are the plan's own
(c10d calls that Dynamo captures and our lowering types, one graph per rank).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.models.checkpoint_files import checkpoint_tensors
from torch_tensorrt_dist.models.hf_attention import PAGED_ATTENTION, register_paged_attention
from torch_tensorrt_dist.models.hf_config import causal_lm_class, kv_shape, model_args
from torch_tensorrt_dist.models.hf_model import PagedHFModel
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader

__all__ = ["GATHERED_HEAD", "build_meta", "check_hf_checkpoint", "load_hf"]

#: the plan styles of a vocabulary-split LM head whose output transformers gathers (a
#: DTensor redistribute, whose split guards on the step's row count): the head runs as plain
#: ``colwise`` and ``PagedHFModel.paged_step`` gathers its logits (``models/vocab.py``'s way)
GATHERED_HEAD = ("colwise_gather_output", "colwise_rep")

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


def check_hf_checkpoint(path: Path, model: nn.Module) -> dict[str, tuple[Path, Any]]:
    """Every parameter of the (meta) model in the checkpoint with its full shape (the
    headers only: nothing read); CheckpointError naming the tensor otherwise."""
    tensors = checkpoint_tensors(path)
    for name, p in model.named_parameters():
        if name not in tensors:
            raise CheckpointError(
                f"{path} lacks tensor {name!r}: the checkpoint does not match its config.json "
                "(or stores the weight in another layout than transformers' model class)"
            )
        shape = tuple(tensors[name][1].shape)
        if shape != tuple(p.shape):
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {list(shape)}, but config.json implies "
                f"{list(p.shape)}; the config and weights do not match"
            )
    return tensors


def _slice(p: torch.Tensor) -> tuple[torch.Size, int | None, int, int]:
    """(local shape, dim, start, stop) of a (DTensor) parameter's shard in its full tensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(p, DTensor):
        return p.shape, None, 0, 0
    full = tuple(p.shape)
    local, offset = compute_local_shape_and_global_offset(full, p.device_mesh, p.placements)
    dims = [d for d in range(len(full)) if local[d] != full[d]]
    if len(dims) > 1:
        raise CheckpointError(f"a shard split along dims {dims}: one dim is read at a time")
    if not dims:
        return torch.Size(local), None, 0, 0
    d = dims[0]
    return torch.Size(local), d, offset[d], offset[d] + local[d]


def _aliases(model: nn.Module, tensors: dict[str, tuple[Path, Any]]) -> dict[str, str]:
    """Each parameter name -> the checkpoint tensor that holds it (a tied head: the
    embedding's, which sharding may have given a tensor of its own)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    out = {}
    for names in by_id.values():
        stored = next((n for n in names if n in tensors), names[0])
        out.update(dict.fromkeys(names, stored))
    return out


def _fill(
    model: nn.Module,
    tensors: dict[str, tuple[Path, Any]],
    aliases: dict[str, str],
    device: torch.device | str,
) -> int:
    """Allocate every parameter's local shard and read it; returns the bytes read."""
    from torch.distributed.tensor import DTensor

    by_file: dict[Path, list[tuple[str, nn.Module, str]]] = {}
    for param_name, _ in model.named_parameters():
        name = aliases.get(param_name, param_name)
        owner, _, attr = param_name.rpartition(".")
        by_file.setdefault(tensors[name][0], []).append((name, model.get_submodule(owner), attr))
    total = 0
    for file, entries in by_file.items():
        with SafetensorsReader(file) as reader:
            for name, module, attr in entries:
                p = module._parameters[attr]
                assert p is not None
                shape, dim, start, stop = _slice(p)
                local = torch.empty(shape, dtype=p.dtype)
                if reader.info(name).dtype == p.dtype:  # straight into its memory
                    reader.read_into(local, name, dim, start, stop)
                else:  # another dtype: one shard-sized temporary
                    local.copy_(reader.read(name, dim, start, stop))
                value: torch.Tensor = local.to(device)
                if isinstance(p, DTensor):
                    value = DTensor.from_local(
                        value, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
                    )
                module._parameters[attr] = nn.Parameter(value, requires_grad=False)
            total += reader.bytes_read
    return total


def _untie(model: nn.Module, aliases: dict[str, str]) -> None:
    """Each name of a shared (meta) parameter gets a parameter of its own, so that the TP
    plan shards each by its own style (both are read from the one checkpoint tensor)."""
    for name, stored in aliases.items():
        if name != stored:
            owner, _, attr = name.rpartition(".")
            module = model.get_submodule(owner)
            p = module._parameters[attr]
            assert p is not None
            module._parameters[attr] = nn.Parameter(torch.empty_like(p), requires_grad=False)


def _retie(model: Any) -> None:
    """Tied weights (the LM head reading the embedding) point at the filled tensor again."""
    if getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        out = model.get_output_embeddings()
        if out is not None:
            out.weight = model.get_input_embeddings().weight


def load_hf(
    path: str | Path,
    cfg: Any,
    *,
    group: dist.ProcessGroup | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> PagedHFModel:
    """This rank's shard of the checkpoint's transformers model, as a :class:`PagedHFModel`
    (``bytes_read``: the checkpoint bytes this rank read)."""
    root = Path(path)
    tp = 1 if group is None else dist.get_world_size(group)
    model = build_meta(cfg, dtype)
    tensors = check_hf_checkpoint(root, model)
    aliases = _aliases(model, tensors)
    if tp > 1:  # a tied head gets its own shard (the head's split, not the embedding's)
        _untie(model, aliases)
        _shard(model, group, device)
    bytes_read = _fill(model, tensors, aliases, device)
    if tp == 1:
        _retie(model)
    model.to(device)  # the buffers (RoPE frequencies)
    paged = PagedHFModel(model, model_args(cfg), kv_shape(cfg, tp=tp))
    if tp > 1 and _head_split(model):
        paged.group = group
    paged.bytes_read = bytes_read
    logger.info("loaded %s as transformers' %s (tp %d)", root, type(model).__name__, tp)
    return paged


def _shard(model: Any, group: dist.ProcessGroup | None, device: torch.device | str) -> None:
    """Apply the model's ``base_model_tp_plan`` on a mesh of ``group`` (parameters stay on
    meta, as DTensors of their local shards)."""
    from torch.distributed.device_mesh import DeviceMesh
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    plan = dict(getattr(model, "tp_plan", None) or {})
    if not plan:
        raise ConfigError(f"{type(model).__name__} has no TP plan: it runs with --tp 1 only")
    head = model.get_output_embeddings()
    for name, module in model.named_modules():  # the head's shards stay local: the step
        if module is head and plan.get(name) in GATHERED_HEAD:  # gathers its logits once
            plan[name] = "colwise"
    mesh = DeviceMesh.from_group(group, torch.device(device).type)  # type: ignore[arg-type]
    apply_tensor_parallelism(model, mesh, model._expand_parallel_plan(plan))


def _head_split(model: Any) -> bool:
    """Whether the LM head holds a vocabulary shard (its logits need a gather)."""
    from torch.distributed.tensor import DTensor, Shard

    w = model.get_output_embeddings().weight
    return isinstance(w, DTensor) and any(isinstance(p, Shard) for p in w.placements)
