"""A transformers model sharded by its own ``base_model_tp_plan`` (the parameters still on the
meta device), and where each sharded parameter's slice lies in the checkpoint's full tensor.

    untie(model, aliases)                 # a tied head gets a parameter of its own to split
    shard(model, group, "cpu")            # transformers' apply_tensor_parallelism on a mesh
    shape, dim, start, stop = shard_slice(param)    # what parallel/hf_load.py reads
    head_split(model)                     # the LM head holds a vocabulary shard

transformers' ``apply_tensor_parallelism`` makes each sharded parameter a DTensor whose local
shard's place in the full tensor is ``compute_local_shape_and_global_offset``'s; its collectives
are the plan's own (c10d calls that Dynamo captures and our lowering types, one graph per rank).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.models.hf_stage import Passthrough

__all__ = ["GATHERED_HEAD", "head_split", "shard", "shard_slice", "untie"]

#: the plan styles of a vocabulary-split LM head whose output transformers gathers (a
#: DTensor redistribute, whose split guards on the step's row count): the head runs as plain
#: ``colwise`` and ``PagedHFModel.paged_step`` gathers its logits (``models/vocab.py``'s way)
GATHERED_HEAD = ("colwise_gather_output", "colwise_rep")


def shard_slice(p: torch.Tensor) -> tuple[torch.Size, int | None, int, int]:
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


def untie(model: nn.Module, aliases: dict[str, str]) -> None:
    """Each name of a shared (meta) parameter gets a parameter of its own, so that the TP
    plan shards each by its own style (both are read from the one checkpoint tensor)."""
    for name, stored in aliases.items():
        if name != stored:
            owner, _, attr = name.rpartition(".")
            module = model.get_submodule(owner)
            p = module._parameters[attr]
            assert p is not None
            module._parameters[attr] = nn.Parameter(torch.empty_like(p), requires_grad=False)


def shard(model: Any, group: dist.ProcessGroup | None, device: torch.device | str) -> None:
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
    modules = dict(model.named_modules())  # a pipeline stage's absent parts: nothing to split
    expanded = model._expand_parallel_plan(plan)
    expanded = {k: v for k, v in expanded.items() if not isinstance(modules.get(k), Passthrough)}
    apply_tensor_parallelism(model, mesh, expanded)


def head_split(model: Any) -> bool:
    """Whether the LM head holds a vocabulary shard (its logits need a gather)."""
    from torch.distributed.tensor import DTensor, Shard

    w = model.get_output_embeddings().weight
    return isinstance(w, DTensor) and any(isinstance(p, Shard) for p in w.placements)
