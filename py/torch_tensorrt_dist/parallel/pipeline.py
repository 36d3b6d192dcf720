"""Pipeline x tensor (x expert) parallel layout: stages of layers on a ``(pp, [ep,] tp)`` mesh.

    ranges = split_layers(32, 4)                    # [range(0, 8), range(8, 16), ...]
    layout = PipelineLayout.of(rank=5, pp=2, tp=4)  # stage 1, tp rank 1, its peers
    mesh = make_pipeline_mesh(pp=2, tp=4)           # every rank, same order
    place = stage_place(mesh, n_layers=32)          # layout, role, TP and pipeline groups

Global rank ``r`` sits at stage ``r // width`` (``width = ep x tp``: the ranks of one stage)
and at ``r % width`` inside it; TP is the innermost mesh dimension, so a stage's TP ranks are
neighbours. Each stage is the model of its family (dense or MoE) with only its layers
(``models/stage.py``), sharded by the family's own plan over the stage's groups. Rank ``i`` of
stage ``s`` sends its hidden states to rank ``i`` of stage ``s + 1``: after a layer's last
collective every rank of a stage holds the same hidden state, so pairing them is exact; the
ranks ``i`` of every stage form a pipeline group, over which the last stage broadcasts the
step's logits (``generation/pipeline.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torch_tensorrt_dist.errors import ConfigError, GroupResolutionError
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.stage import StageRole
from torch_tensorrt_dist.parallel.llama import tp_layout
from torch_tensorrt_dist.parallel.mesh import mesh_device_type

__all__ = [
    "PipelineLayout",
    "StagePlace",
    "check_mesh",
    "make_pipeline_mesh",
    "split_layers",
    "stage_place",
    "stage_role",
    "stage_tensor_names",
]


def split_layers(n_layers: int, pp: int, split: Sequence[int] | None = None) -> list[range]:
    """The layers of each of ``pp`` stages: even by default (earlier stages take the remainder),
    or ``split`` layer counts per stage (e.g. ``[3, 5]``)."""
    if pp < 1:
        raise ConfigError(f"pp must be >= 1, got {pp}")
    if pp > n_layers:
        raise ConfigError(
            f"pp={pp} stages but the model has {n_layers} layers; every stage needs at least one "
            f"layer: use pp <= {n_layers}"
        )
    if split is None:
        base, extra = divmod(n_layers, pp)
        counts = [base + (1 if s < extra else 0) for s in range(pp)]
    else:
        counts = [int(c) for c in split]
        if len(counts) != pp:
            raise ConfigError(
                f"split {counts} has {len(counts)} entries; give one per stage ({pp})"
            )
        if any(c < 1 for c in counts):
            raise ConfigError(f"split {counts}: every stage needs at least one layer")
        if sum(counts) != n_layers:
            raise ConfigError(
                f"split {counts} covers {sum(counts)} layers, but the model has {n_layers}; "
                "the counts must add up to the layer count"
            )
    ranges, start = [], 0
    for c in counts:
        ranges.append(range(start, start + c))
        start += c
    return ranges


def check_mesh(pp: int, tp: int, world_size: int, args: ModelArgs | None = None) -> None:
    """Raise ConfigError unless a ``(pp, tp)`` mesh fits ``world_size`` ranks (and the model)."""
    if pp < 1 or tp < 1:
        raise ConfigError(f"pp and tp must be >= 1, got pp={pp} tp={tp}")
    if pp * tp != world_size:
        hint = [f"pp={world_size // tp} tp={tp}"] if world_size % tp == 0 else []
        hint += [f"pp={pp} tp={world_size // pp}"] if world_size % pp == 0 else []
        fix = f"use {' or '.join(hint)}" if hint else f"start {pp * tp} ranks"
        raise ConfigError(
            f"mesh pp={pp} x tp={tp} needs {pp * tp} ranks, but the world size is {world_size}; "
            f"{fix}"
        )
    if args is not None:
        split_layers(args.n_layers, pp)
        tp_layout(args, 0, tp)  # heads and MLP divisible by tp


@dataclass(frozen=True)
class PipelineLayout:
    """Where global ``rank`` sits on the ``(pp, ep, tp)`` mesh and whom it talks to (pure)."""

    rank: int
    pp: int
    tp: int
    ep: int = 1

    @classmethod
    def of(cls, rank: int, pp: int, tp: int, ep: int = 1) -> PipelineLayout:
        if not 0 <= rank < pp * ep * tp:
            where = f"pp={pp} x tp={tp}" if ep == 1 else f"pp={pp} x ep={ep} x tp={tp}"
            raise ConfigError(f"rank {rank} is not on a {where} mesh")
        return cls(rank, pp, tp, ep)

    @property
    def width(self) -> int:
        """Ranks per stage (``ep x tp``)."""
        return self.ep * self.tp

    @property
    def stage(self) -> int:
        return self.rank // self.width

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.pp - 1

    @property
    def tp_ranks(self) -> list[int]:
        """Global ranks of this rank's TP group."""
        first = self.rank - self.tp_rank
        return list(range(first, first + self.tp))

    @property
    def pp_ranks(self) -> list[int]:
        """Global ranks of this rank's pipeline group: its place in every stage, first to last."""
        return [s * self.width + self.rank % self.width for s in range(self.pp)]

    @property
    def prev(self) -> int | None:
        """The rank hidden states come from (the same place in the previous stage)."""
        return None if self.is_first else self.rank - self.width

    @property
    def next(self) -> int | None:
        """The rank hidden states go to (the same place in the next stage)."""
        return None if self.is_last else self.rank + self.width

    @property
    def logits_source(self) -> int:
        """The last-stage rank whose logits this rank's pipeline group receives."""
        return self.pp_ranks[-1]


def stage_role(n_layers: int, layout: PipelineLayout, split: Sequence[int] | None) -> StageRole:
    """The stage this rank runs: its index and its layers."""
    ranges = split_layers(n_layers, layout.pp, split)
    return StageRole(layout.stage, layout.pp, ranges[layout.stage], max(map(len, ranges)))


def make_pipeline_mesh(
    pp: int, tp: int, device_type: str | None = None, *, ep: int | None = None
) -> DeviceMesh:
    """``init_device_mesh(device, (pp, tp))`` (dims ``pp``, ``tp``), or with ``ep`` (a MoE
    model's stages, 1 included) ``(pp, ep, tp)``, after checking the world's size."""
    if not dist.is_initialized():
        raise ConfigError(
            "a pipeline mesh needs torch.distributed initialised (init_distributed())"
        )
    world = dist.get_world_size()
    if ep is None:
        check_mesh(pp, tp, world)
    elif pp * ep * tp != world:
        raise ConfigError(
            f"mesh pp={pp} x ep={ep} x tp={tp} needs {pp * ep * tp} ranks, but the world size "
            f"is {world}"
        )
    device_type = device_type or mesh_device_type()
    if ep is None:
        return init_device_mesh(device_type, (pp, tp), mesh_dim_names=("pp", "tp"))
    return init_device_mesh(device_type, (pp, ep, tp), mesh_dim_names=("pp", "ep", "tp"))


@dataclass(frozen=True)
class StagePlace:
    """One rank's stage: where it sits, what it runs, and its groups."""

    layout: PipelineLayout
    role: StageRole
    mesh: DeviceMesh
    tp_group: dist.ProcessGroup | None
    """The stage's TP group (None at tp 1)."""
    pp_group: dist.ProcessGroup
    """This rank's pipeline group (``layout.pp_ranks``): the logits' broadcast."""

    @property
    def stage_mesh(self) -> DeviceMesh:
        """The ``(ep, tp)`` mesh of this rank's stage (a ``(pp, ep, tp)`` mesh): where a MoE
        stage finds its groups."""
        if self.mesh.mesh_dim_names != ("pp", "ep", "tp"):
            raise ConfigError("a MoE stage needs a (pp, ep, tp) mesh: make_pipeline_mesh(ep=...)")
        return self.mesh["ep", "tp"]


def stage_place(mesh: DeviceMesh, n_layers: int, split: Sequence[int] | None = None) -> StagePlace:
    """This rank's place on a :func:`make_pipeline_mesh` mesh, its groups checked against the
    layout (TP must be the inner dimension)."""
    names = mesh.mesh_dim_names
    if names not in (("pp", "tp"), ("pp", "ep", "tp")):
        raise ConfigError(f"expected a ('pp', ['ep',] 'tp') mesh, got dims {names}")
    pp, tp = mesh.size(0), mesh.size(-1)
    ep = mesh.size(1) if len(names) == 3 else 1
    layout = PipelineLayout.of(dist.get_rank(), pp, tp, ep)
    group = mesh.get_group("tp") if tp > 1 else None
    pp_group = mesh.get_group("pp")
    for what, g, want in (("TP", group, layout.tp_ranks), ("pipeline", pp_group, layout.pp_ranks)):
        ranks = dist.get_process_group_ranks(g) if g is not None else want
        if ranks != want:
            raise GroupResolutionError(
                f"rank {layout.rank}: the mesh's {what} group holds ranks {ranks}, but its "
                f"layout owns {want}; build the mesh with make_pipeline_mesh (TP inner)"
            )
    return StagePlace(layout, stage_role(n_layers, layout, split), mesh, group, pp_group)


def stage_tensor_names(
    args: ModelArgs, stage: int, pp: int, split: Sequence[int] | None = None
) -> list[str]:
    """The checkpoint tensors stage ``stage`` reads (pure: for tests and planning)."""
    from torch_tensorrt_dist.models.llama import Transformer
    from torch_tensorrt_dist.models.stage import cut_stage
    from torch_tensorrt_dist.parallel.llama_load import hf_name

    with torch.device("meta"):
        model = Transformer(args)
    cut_stage(model, StageRole(stage, pp, split_layers(args.n_layers, pp, split)[stage]))
    return sorted({hf_name(name, args) for name, _ in model.named_parameters()})
