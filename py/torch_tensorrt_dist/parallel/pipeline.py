"""Pipeline x tensor parallel layout: stages of layers on a 2-D ``(pp, tp)`` mesh.

    ranges = split_layers(32, 4)                  # [range(0, 8), range(8, 16), ...]
    layout = PipelineLayout.of(rank=5, pp=2, tp=4) # stage 1, tp rank 1, peers
    stage = PipelineStage(args, stage=1, pp=2, layers=ranges[1])
    shard_stage(stage, tp_group)                   # the TP plan of parallel/llama.py

Global rank ``r`` sits at stage ``r // tp`` and TP rank ``r % tp`` (TP is the inner, fastest
varying mesh dimension, so a stage's TP ranks are neighbours). Activations go from TP rank i of
stage s to TP rank i of stage s + 1: after a layer's all-reduce every TP rank of a stage holds
the same hidden state, so pairing rank for rank is exact and needs no collective between stages.

The first stage holds the token embedding, the last one the final norm and LM head; every stage
holds only its layers (under their global index, so checkpoint names map one to one) and the KV
cache of those layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torch_tensorrt_dist.errors import ConfigError, GroupResolutionError
from torch_tensorrt_dist.models.llama import (
    KVCache,
    RMSNorm,
    TransformerBlock,
    VocabEmbedding,
    lm_logits,
    mask_and_positions,
    rope_tables,
)
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.parallel.llama import (
    Embedding,
    LMHead,
    shard_modules,
    tp_layout,
)

__all__ = [
    "PipelineLayout",
    "PipelineStage",
    "RowKVCache",
    "check_mesh",
    "make_pipeline_mesh",
    "shard_stage",
    "split_layers",
    "stage_groups",
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
    """Where global ``rank`` sits on the ``(pp, tp)`` mesh and whom it talks to (pure)."""

    rank: int
    pp: int
    tp: int

    @classmethod
    def of(cls, rank: int, pp: int, tp: int) -> PipelineLayout:
        if not 0 <= rank < pp * tp:
            raise ConfigError(f"rank {rank} is not on a pp={pp} x tp={tp} mesh")
        return cls(rank, pp, tp)

    @property
    def stage(self) -> int:
        return self.rank // self.tp

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
        """Global ranks of this stage's TP group."""
        return [self.stage * self.tp + t for t in range(self.tp)]

    @property
    def prev(self) -> int | None:
        """The rank activations come from (same TP rank, previous stage)."""
        return None if self.is_first else self.rank - self.tp

    @property
    def next(self) -> int | None:
        """The rank activations go to (same TP rank, next stage)."""
        return None if self.is_last else self.rank + self.tp

    @property
    def token_peer(self) -> int | None:
        """Last stage: the first-stage rank it returns sampled tokens to; first stage: the
        last-stage rank they come from. None for middle stages, or when pp == 1."""
        if self.pp == 1:
            return None
        if self.is_last:
            return self.tp_rank
        if self.is_first:
            return (self.pp - 1) * self.tp + self.tp_rank
        return None


def make_pipeline_mesh(pp: int, tp: int, device_type: str | None = None) -> DeviceMesh:
    """``init_device_mesh(device, (pp, tp), mesh_dim_names=("pp", "tp"))`` after checking sizes."""
    if not dist.is_initialized():
        raise ConfigError(
            "a pipeline mesh needs torch.distributed initialised (init_distributed())"
        )
    check_mesh(pp, tp, dist.get_world_size())
    if device_type is None:
        device_type = (
            "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
        )
    return init_device_mesh(device_type, (pp, tp), mesh_dim_names=("pp", "tp"))


def stage_groups(mesh: DeviceMesh) -> tuple[PipelineLayout, dist.ProcessGroup | None]:
    """This rank's layout and TP group, with the group's ranks checked against the layout."""
    if mesh.mesh_dim_names != ("pp", "tp"):
        raise ConfigError(f"expected a ('pp', 'tp') mesh, got dims {mesh.mesh_dim_names}")
    pp, tp = mesh.shape
    layout = PipelineLayout.of(dist.get_rank(), pp, tp)
    if tp == 1:
        return layout, None
    group = mesh.get_group("tp")
    ranks = dist.get_process_group_ranks(group)
    if ranks != layout.tp_ranks:
        raise GroupResolutionError(
            f"rank {layout.rank}: the mesh's TP group holds ranks {ranks}, but stage "
            f"{layout.stage} of pp={pp} x tp={tp} owns {layout.tp_ranks}; build the mesh with "
            "make_pipeline_mesh (TP must be the inner mesh dimension)"
        )
    return layout, group


class RowKVCache(KVCache):
    """A KV cache whose batch rows come from ``rows`` (a buffer shared by a stage's layers)."""

    rows: Tensor

    def __init__(
        self,
        max_batch_size: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str | None,
        rows: Tensor,
    ) -> None:
        super().__init__(max_batch_size, n_kv_heads, max_seq_len, head_dim, dtype, device)
        self.register_buffer("rows", rows, persistent=False)

    def update(self, cache_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # cache_pos: [S]; k, v: [b, H_kv, S, D] -> this microbatch's caches [b, H_kv, L, D]
        rows = self.rows[: k.shape[0]]
        where = (rows[:, None], slice(None), cache_pos[None, :])  # value: [b, S, H_kv, D]
        self.k_cache[where] = k.transpose(1, 2)
        self.v_cache[where] = v.transpose(1, 2)
        return self.k_cache.index_select(0, rows), self.v_cache.index_select(0, rows)


class PipelineStage(nn.Module):
    """The part of a Llama decoder that one pipeline stage runs.

    First stage: ``tokens [B, S] int64 -> hidden [B, S, dim]``; middle: ``hidden -> hidden``;
    last: ``hidden -> logits [B, S|1, V]`` (pp == 1: tokens -> logits). Layers keep their global
    index (``layers["5"]``), so parameter names are those of the whole model.
    """

    rope_cos: Tensor
    rope_sin: Tensor
    key_slots: Tensor
    cache_rows: Tensor

    def __init__(self, args: ModelArgs, *, stage: int, pp: int, layers: range) -> None:
        super().__init__()
        self.args, self.stage, self.pp, self.layer_ids = args, stage, pp, layers
        self.is_first, self.is_last = stage == 0, stage == pp - 1
        emb = VocabEmbedding(args.vocab_size, args.dim) if self.is_first else None
        self.tok_embeddings = emb
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in layers})
        self.norm = RMSNorm(args.dim, args.norm_eps) if self.is_last else None
        # always its own matrix: a tied head is loaded from the embedding (own copy when pp > 1)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False) if self.is_last else None
        self.group: dist.ProcessGroup | None = None  # set when the LM head is vocab-parallel
        self.max_seq_len = -1

    @property
    def blocks(self) -> list[TransformerBlock]:
        return [b for b in self.layers.values() if isinstance(b, TransformerBlock)]

    def setup_caches(self, max_batch_size: int, max_seq_len: int, *, microbatches: int = 1) -> None:
        """KV caches of this stage's layers only, and the RoPE tables.

        With ``microbatches`` > 1 the caches are addressed by row: :meth:`select_rows` picks the
        cache rows of the microbatch the next call runs, so every microbatch shares one graph.
        """
        if max_seq_len > self.args.max_seq_len:
            raise ConfigError(
                f"max_seq_len={max_seq_len} exceeds the model's limit {self.args.max_seq_len}"
            )
        param = next(self.parameters())
        rows = torch.arange(max_batch_size, device=param.device)
        self.register_buffer("cache_rows", rows, persistent=False)
        for block in self.blocks:
            attn = block.attention
            shape = (max_batch_size, attn.n_kv_heads, max_seq_len, attn.head_dim)
            if microbatches > 1:
                attn.kv_cache = RowKVCache(*shape, param.dtype, param.device, self.cache_rows)
            else:
                attn.kv_cache = KVCache(*shape, param.dtype, param.device)
        cos, sin = rope_tables(self.args, max_seq_len)
        self.register_buffer("rope_cos", cos.to(param.device), persistent=False)
        self.register_buffer("rope_sin", sin.to(param.device), persistent=False)
        slots = torch.arange(max_seq_len, device=param.device)
        self.register_buffer("key_slots", slots, persistent=False)
        self.max_seq_len = max_seq_len

    def select_rows(self, start: int, count: int) -> None:
        """Route the next call's KV reads and writes to cache rows [start, start + count)."""
        self.cache_rows[:count].copy_(torch.arange(start, start + count))

    def forward(self, x: Tensor, cache_pos: Tensor, pad: Tensor, last_only: bool = False) -> Tensor:
        if self.max_seq_len < 0:
            raise ConfigError("call PipelineStage.setup_caches(...) before running the stage")
        mask, positions = mask_and_positions(self.args, self.key_slots, cache_pos, pad)
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)  # [B, S] -> [B, S, dim]
        cos = self.rope_cos[positions].to(x.dtype)  # [B, S, D]
        sin = self.rope_sin[positions].to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin, mask, cache_pos)
        if self.norm is None or self.output is None:
            return x  # hidden [B, S, dim] for the next stage
        if last_only:
            x = x[:, -1:]
        return lm_logits(self.norm(x), self.output.weight, self.group, self.args.vocab_size)


def shard_stage(
    stage: PipelineStage,
    group: dist.ProcessGroup | None,
    *,
    lm_head: LMHead = "vocab_parallel",
    embedding: Embedding = "vocab_parallel",
) -> PipelineStage:
    """Apply the TP plan of ``parallel/llama.py`` to a stage (meta or real weights), in place."""
    if group is None or dist.get_world_size(group) == 1:
        return stage
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    layout = tp_layout(stage.args, rank, size, lm_head, embedding)
    shard_modules(stage, stage.blocks, stage.tok_embeddings, layout, group)
    stage.group = group if stage.is_last and lm_head == "vocab_parallel" else None
    return stage
