"""Expert parallel x tensor parallel plan for MoE decoders (``models/moe.py``).

    mesh = make_moe_mesh(ep=2, tp=2)              # 4 ranks, TP inner: rank = ep_rank * tp + tp_rank
    groups = moe_groups(mesh)                     # TP group, EP x TP group, ranks
    apply_moe_parallel(model, groups)             # cut attention by TP, experts by EP and TP

Layout (``E x T`` ranks, TP innermost):

    attention, dense MLPs     tensor parallel over the TP group (``parallel/llama.py``), the same
                              on every EP rank (batch-1 decode holds one token: EP ranks hold the
                              same activations); embedding and LM head vocabulary-parallel on TP
    router (gate)             replicated
    routed experts            experts ``[ep_rank * E/ep, (ep_rank + 1) * E/ep)`` on this rank,
                              each expert's SwiGLU column/row-parallel over the TP group
    shared expert (Qwen2-MoE) column/row-parallel over the whole EP x TP group (1/(ep x tp) each)
    MoE output                ONE all-reduce(sum) over the EP x TP group of [B, S, dim]

Every rank holds all (replicated) tokens and computes its experts for the tokens routed to them
(``ops/experts.py``; zero for the others), so shapes never depend on the routing; docs/moe.md
compares this with an all-to-all dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe import MoETransformer
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.parallel.llama import (
    Embedding,
    LMHead,
    ShardSlice,
    apply_tp,
    take_slice,
    tp_layout,
)
from torch_tensorrt_dist.parallel.mesh import mesh_device_type

__all__ = [
    "MoEGroups",
    "MoELayout",
    "apply_moe_parallel",
    "expert_slice",
    "make_moe_mesh",
    "moe_groups",
    "moe_layout",
]


@dataclass(frozen=True)
class MoELayout:
    """Per-rank geometry of the expert x tensor parallel model (pure: no process group)."""

    ep: int
    tp: int
    ep_rank: int
    tp_rank: int
    n_experts: int
    expert_size: int
    shared_expert_size: int = 0

    @property
    def local_experts(self) -> int:
        return self.n_experts // self.ep

    @property
    def expert_start(self) -> int:
        return self.ep_rank * self.local_experts

    @property
    def expert_shard(self) -> int:
        """Rows of each local expert's SwiGLU this rank holds (``expert_size / tp``)."""
        return self.expert_size // self.tp

    @property
    def group_rank(self) -> int:
        """This rank's index in the EP x TP group (TP inner)."""
        return self.ep_rank * self.tp + self.tp_rank

    @property
    def shared_shard(self) -> int:
        return self.shared_expert_size // (self.ep * self.tp)


def moe_layout(
    args: ModelArgs,
    moe: MoEArgs,
    *,
    ep: int,
    tp: int,
    ep_rank: int = 0,
    tp_rank: int = 0,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> MoELayout:
    """Validate that the model splits over ``ep x tp`` ranks; ConfigError names the numbers."""
    if ep < 1 or tp < 1:
        raise ConfigError(f"ep and tp must be >= 1, got ep={ep} tp={tp}")
    if not (0 <= ep_rank < ep and 0 <= tp_rank < tp):
        raise ConfigError(f"bad ranks ep_rank={ep_rank} of {ep}, tp_rank={tp_rank} of {tp}")
    if moe.n_experts % ep:
        good = [e for e in range(1, moe.n_experts + 1) if moe.n_experts % e == 0]
        raise ConfigError(f"ep={ep} does not divide the {moe.n_experts} experts; use ep in {good}")
    if moe.expert_size % tp:
        raise ConfigError(
            f"tp={tp} does not divide the expert FFN size {moe.expert_size} "
            "(moe_intermediate_size / intermediate_size); pick a tp that divides it"
        )
    if moe.shared_expert_size % (ep * tp):
        raise ConfigError(
            f"ep x tp = {ep * tp} does not divide the shared expert FFN size "
            f"{moe.shared_expert_size} (shared_expert_intermediate_size), which is split over "
            "the EP x TP group"
        )
    tp_layout(args, tp_rank, tp, lm_head, embedding)  # attention heads, dense MLP, vocabulary
    return MoELayout(
        ep, tp, ep_rank, tp_rank, moe.n_experts, moe.expert_size, moe.shared_expert_size
    )


def expert_slice(kind: str, layout: MoELayout) -> ShardSlice | None:
    """This rank's slice of ONE expert's checkpoint tensor: ``kind`` is ``w1``/``w3`` ([I, D],
    rows split) or ``w2`` ([D, I], columns split); None at tp 1."""
    if layout.tp == 1:
        return None
    n, r = layout.expert_shard, layout.tp_rank
    dim = 1 if kind == "w2" else 0
    return ShardSlice(dim, r * n, (r + 1) * n, n)


def shared_slice(kind: str, layout: MoELayout) -> ShardSlice | None:
    """This rank's slice of the shared expert's ``w1``/``w3`` (rows) or ``w2`` (columns)."""
    if layout.ep * layout.tp == 1:
        return None
    n, r = layout.shared_shard, layout.group_rank
    dim = 1 if kind == "w2" else 0
    return ShardSlice(dim, r * n, (r + 1) * n, n)


@dataclass(frozen=True)
class MoEGroups:
    """The process groups of one rank of an ``ep x tp`` job."""

    ep: int
    tp: int
    ep_rank: int
    tp_rank: int
    tp_group: dist.ProcessGroup | None
    """Attention's all-reduces, the vocabulary-parallel embedding and LM head (None at tp 1)."""
    moe_group: dist.ProcessGroup | None
    """The MoE all-reduce: every rank of the EP x TP group (None at ep x tp = 1)."""

    def layout(
        self,
        args: ModelArgs,
        moe: MoEArgs,
        lm_head: LMHead = "vocab_parallel",
        embedding: Embedding = "vocab_parallel",
    ) -> MoELayout:
        """This rank's :func:`moe_layout` (checked: ConfigError names the numbers)."""
        return moe_layout(
            args,
            moe,
            ep=self.ep,
            tp=self.tp,
            ep_rank=self.ep_rank,
            tp_rank=self.tp_rank,
            lm_head=lm_head,
            embedding=embedding,
        )


def make_moe_mesh(ep: int, tp: int, device_type: str | None = None) -> DeviceMesh:
    """``init_device_mesh(device, (ep, tp), mesh_dim_names=("ep", "tp"))`` after checking sizes."""
    if not dist.is_initialized():
        raise ConfigError("make_moe_mesh needs torch.distributed initialised")
    world = dist.get_world_size()
    if ep < 1 or tp < 1 or ep * tp != world:
        raise ConfigError(
            f"ep={ep} x tp={tp} = {ep * tp} ranks does not match the world size {world}"
        )
    device = device_type or mesh_device_type()
    return init_device_mesh(device, (ep, tp), mesh_dim_names=("ep", "tp"))


def moe_groups(mesh: DeviceMesh) -> MoEGroups:
    """The TP group and the EP x TP group (a flattened sub-mesh) of this rank's ``(ep, tp)``
    mesh; single-rank groups are None (no collective)."""
    ep, tp = mesh.size(0), mesh.size(1)
    coord = mesh.get_coordinate()
    if coord is None:
        raise ConfigError("this rank is not in the MoE mesh")
    ep_rank, tp_rank = coord
    tp_group = mesh.get_group("tp") if tp > 1 else None
    # DeviceMesh._flatten (private in torch 2.14, exercised by every MoE test) gives the EP x TP
    # sub-mesh one group with a name the captured collectives carry
    moe_group = mesh["ep", "tp"]._flatten("ep_tp").get_group() if ep * tp > 1 else None
    return MoEGroups(ep, tp, ep_rank, tp_rank, tp_group, moe_group)


def apply_moe_parallel(
    model: MoETransformer,
    groups: MoEGroups,
    *,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> MoETransformer:
    """Shard ``model`` in place (meta or real weights): attention and dense MLPs over TP
    (the Llama plan), experts over EP and TP, the shared expert over EP x TP."""
    layout = groups.layout(model.args, model.moe, lm_head, embedding)
    apply_tp(model, groups.tp_group, lm_head=lm_head, embedding=embedding)
    for moe in model.sparse_blocks:
        first, count = layout.expert_start, layout.local_experts
        for kind in ("w1", "w3", "w2"):
            full = getattr(moe, kind).data.narrow(0, first, count)  # [E_local, ...]
            sl = expert_slice(kind, layout)
            if sl is not None:  # per-expert dims are one to the right in the stacked tensor
                sl = ShardSlice(sl.dim + 1, sl.start, sl.stop, sl.padded)
            setattr(moe, kind, nn.Parameter(take_slice(full, sl).clone(), requires_grad=False))
        if moe.shared is not None:
            for kind in ("w1", "w3", "w2"):
                linear = getattr(moe.shared, kind)
                new = take_slice(linear.weight.data, shared_slice(kind, layout))
                linear.weight = nn.Parameter(new, requires_grad=False)
        moe.expert_start = layout.expert_start
        moe.group = groups.moe_group
    return model
