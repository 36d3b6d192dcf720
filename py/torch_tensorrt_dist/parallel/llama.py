"""Tensor-parallel plan for the Llama decoder (``models/llama.py``), gpt-fast style.

Weights are sharded by hand and the forward issues plain functional collectives on the TP group
it is given (never the world group), so a compiled decode step holds exactly two all-reduces per
layer and plain tensors:

    q/k/v, gate (w1), up (w3)   column-parallel (output rows split; biases split with them)
    q/k per-head norms (Qwen3)  replicated: each acts on one head's head_dim values, so every
                                rank's whole heads use the same weight
    o (wo), down (w2)           row-parallel (input columns split) + all-reduce(sum)
    embedding                   vocabulary-parallel (default) + one all-reduce of [B, S, dim],
                                or replicated (``embedding="replicated"``: no collective, but
                                every rank holds the whole matrix, 1 GB for Llama 3 8B in bf16)
    LM head                     vocabulary-parallel (default) + one all-gather of the logits,
                                or replicated (``lm_head="replicated"``)

Vocabulary shards are ``ceil(V / tp)`` rows, the last one zero-padded. With tied embeddings
and both vocabulary-parallel, the head reads the embedding's shard: one matrix, 1/tp of it.

Per-rank head counts are derived (``n_heads // tp``), never recovered by ``view(..., -1, D)``.
When tp exceeds the KV head count, KV heads are replicated as vLLM does: each rank keeps the one
KV head its query heads use (needs tp % n_kv_heads == 0).

:func:`shard_slice` is the pure core: the loader uses it to read only a rank's slice of each
checkpoint tensor; :func:`apply_tp` uses it to shard a model built whole (on meta or real).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama import (
    ModelArgs,
    Transformer,
    TransformerBlock,
    VocabEmbedding,
)

__all__ = [
    "TP_PLAN",
    "Embedding",
    "LMHead",
    "ShardSlice",
    "TPLayout",
    "apply_tp",
    "resolve_tp_group",
    "shard_modules",
    "shard_slice",
    "take_slice",
    "tp_layout",
    "valid_tp_sizes",
]

LMHead = Literal["vocab_parallel", "replicated"]
Embedding = Literal["vocab_parallel", "replicated"]

#: Module-path suffix -> sharding style. Modules not listed (norms, Qwen3's ``wq.norm`` and
#: ``wk.norm`` inside the q/k projections) are replicated.
TP_PLAN: dict[str, str] = {
    "tok_embeddings": "vocab_embedding",
    "attention.wq": "colwise_q",
    "attention.wk": "colwise_kv",
    "attention.wv": "colwise_kv",
    "attention.wo": "rowwise",
    "feed_forward.w1": "colwise",
    "feed_forward.w3": "colwise",
    "feed_forward.w2": "rowwise",
    "output": "vocab",
}


@dataclass(frozen=True)
class ShardSlice:
    """This rank's part of a full tensor: ``full.narrow(dim, start, stop - start)``, zero-padded
    along ``dim`` to ``padded`` rows (only vocab shards are padded)."""

    dim: int
    start: int
    stop: int
    padded: int


@dataclass(frozen=True)
class TPLayout:
    """Per-rank geometry of the sharded model (pure: no process group needed)."""

    rank: int
    size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    lm_head: LMHead
    embedding: Embedding = "vocab_parallel"

    @property
    def local_heads(self) -> int:
        return self.n_heads // self.size

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.n_kv_heads // self.size)

    @property
    def kv_head_start(self) -> int:
        # divisible case: rank * local_kv; replicated case: the KV head of this rank's q heads
        return self.rank * self.n_kv_heads // self.size

    @property
    def vocab_shard(self) -> int:
        return math.ceil(self.vocab_size / self.size)

    @property
    def vocab_start(self) -> int:
        """The first vocabulary row of this rank's shard (embedding and LM head alike)."""
        return self.rank * self.vocab_shard


def valid_tp_sizes(args: ModelArgs) -> list[int]:
    """Every tp the attention heads allow (the MLP must also divide)."""
    return [
        t
        for t in range(1, args.n_heads + 1)
        if args.n_heads % t == 0
        and (args.n_kv_heads % t == 0 or t % args.n_kv_heads == 0)
        and args.intermediate_size % t == 0
    ]


def tp_layout(
    args: ModelArgs,
    rank: int,
    size: int,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> TPLayout:
    """Validate that ``args`` shards over ``size`` ranks; ConfigError says what to change."""
    if size < 1 or not 0 <= rank < size:
        raise ConfigError(f"bad tensor-parallel rank {rank} of size {size}")
    if lm_head not in ("vocab_parallel", "replicated"):
        raise ConfigError(f"lm_head={lm_head!r}; use 'vocab_parallel' or 'replicated'")
    if embedding not in ("vocab_parallel", "replicated"):
        raise ConfigError(f"embedding={embedding!r}; use 'vocab_parallel' or 'replicated'")
    if args.n_heads % size:
        raise ConfigError(
            f"num_attention_heads={args.n_heads} is not divisible by tp={size}; use tp in "
            f"{valid_tp_sizes(args)}"
        )
    if args.n_kv_heads % size and size % args.n_kv_heads:
        raise ConfigError(
            f"num_key_value_heads={args.n_kv_heads} and tp={size}: tp must divide the KV head "
            "count, or be a multiple of it (KV heads are then replicated); use tp in "
            f"{valid_tp_sizes(args)}"
        )
    if args.intermediate_size % size:
        raise ConfigError(
            f"intermediate_size={args.intermediate_size} is not divisible by tp={size}; "
            f"use tp in {valid_tp_sizes(args)}"
        )
    return TPLayout(
        rank,
        size,
        args.n_heads,
        args.n_kv_heads,
        args.head_dim,
        args.intermediate_size,
        args.vocab_size,
        lm_head,
        embedding,
    )


def _style(name: str) -> str | None:
    module = name.rsplit(".", 1)[0]
    for suffix, style in TP_PLAN.items():
        if module == suffix or module.endswith("." + suffix):
            return style
    return None


def shard_slice(name: str, layout: TPLayout) -> ShardSlice | None:
    """The slice of parameter ``name`` (our naming) this rank holds; None when replicated."""
    style = _style(name)
    if layout.size == 1 or style is None:
        return None
    r, d = layout.rank, layout.head_dim
    if style == "colwise_q":
        n = layout.local_heads * d
        return ShardSlice(0, r * n, (r + 1) * n, n)
    if style == "colwise_kv":
        start, n = layout.kv_head_start * d, layout.local_kv_heads * d
        return ShardSlice(0, start, start + n, n)
    if style == "colwise" or style == "rowwise":
        dim = 0 if style == "colwise" else 1
        if "attention" in name:
            n = layout.local_heads * d
        else:
            n = layout.intermediate_size // layout.size
        return ShardSlice(dim, r * n, (r + 1) * n, n)
    # vocab: the embedding's or the LM head's rows; the last shard is zero-padded (V % tp != 0)
    mode = layout.embedding if style == "vocab_embedding" else layout.lm_head
    if mode == "replicated":
        return None
    n = layout.vocab_shard
    return ShardSlice(0, min(r * n, layout.vocab_size), min((r + 1) * n, layout.vocab_size), n)


def take_slice(full: torch.Tensor, sl: ShardSlice | None) -> torch.Tensor:
    """Apply ``sl`` to a full tensor (a copy: the full tensor can be freed)."""
    if sl is None:
        return full
    part = full.narrow(sl.dim, sl.start, sl.stop - sl.start)
    missing = sl.padded - (sl.stop - sl.start)
    if missing:
        pad_shape = list(part.shape)
        pad_shape[sl.dim] = missing
        part = torch.cat([part, part.new_zeros(pad_shape)], dim=sl.dim)
    return part.clone()


def resolve_tp_group(
    group: dist.ProcessGroup | DeviceMesh | None, mesh_dim: int | str | None = None
) -> dist.ProcessGroup | None:
    """The TP ProcessGroup from a group, a 1-D mesh, or a mesh and one of its dims."""
    if group is None or isinstance(group, dist.ProcessGroup):
        return group
    if isinstance(group, DeviceMesh):
        if mesh_dim is None and group.ndim != 1:
            raise ConfigError(f"a {group.ndim}-D mesh needs mesh_dim (e.g. 'tp') to pick TP")
        return group.get_group(mesh_dim if mesh_dim is not None else 0)
    raise ConfigError(f"expected a ProcessGroup or DeviceMesh for tp, got {type(group).__name__}")


def apply_tp(
    model: Transformer,
    group: dist.ProcessGroup | DeviceMesh | None,
    *,
    mesh_dim: int | str | None = None,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> Transformer:
    """Shard ``model`` in place over the TP ``group`` (works on meta or materialised weights)."""
    pg = resolve_tp_group(group, mesh_dim)
    if pg is None or dist.get_world_size(pg) == 1:
        return model
    layout = tp_layout(model.args, dist.get_rank(pg), dist.get_world_size(pg), lm_head, embedding)
    if model.args.tie_embeddings and lm_head != embedding:
        # sharded differently: the head gets its own matrix, cut (or not) on its own
        model.output = nn.Linear(
            model.args.dim,
            model.args.vocab_size,
            bias=False,
            device=model.tok_embeddings.weight.device,
            dtype=model.tok_embeddings.weight.dtype,
        )
        model.output.weight = model.tok_embeddings.weight
    shard_modules(model, model.blocks, model.tok_embeddings, layout, pg)
    model.group = pg if lm_head == "vocab_parallel" else None
    return model


def shard_modules(
    root: nn.Module,
    blocks: list[TransformerBlock],
    embedding: VocabEmbedding | None,
    layout: TPLayout,
    group: dist.ProcessGroup,
) -> None:
    """Cut every parameter of ``root`` to this rank's slice and point the decoder blocks (and a
    vocabulary-parallel embedding) at ``group``: the part of the plan a whole model and a
    pipeline stage share."""
    for name, module in root.named_modules():
        if not isinstance(module, nn.Linear | nn.Embedding):
            continue
        for pname, param in list(module.named_parameters(recurse=False)):
            sl = shard_slice(f"{name}.{pname}", layout)
            if sl is not None and not (pname == "bias" and sl.dim == 1):
                new = take_slice(param.data, sl)
                setattr(module, pname, nn.Parameter(new, requires_grad=False))
    for block in blocks:
        block.attention.n_heads = layout.local_heads
        block.attention.n_kv_heads = layout.local_kv_heads
        block.attention.group = group
        block.feed_forward.group = group
    if embedding is not None and layout.embedding == "vocab_parallel":
        embedding.group, embedding.start = group, layout.vocab_start
