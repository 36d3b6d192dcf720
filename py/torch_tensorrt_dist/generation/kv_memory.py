"""How many KV-cache blocks a rank holds: bytes per block, ``--kv-cache-memory`` to blocks.

    layout = kv_layout_for(args, tp=2, dtype=torch.bfloat16, block_size=16)   # before loading
    layout = kv_layout(model, block_size=16)                                  # a built model
    blocks = layout.blocks_for_memory(2 << 30, rows=8, max_seq_len=4096)

A block holds ``block_size`` tokens of every layer's keys and values for this rank's KV heads:
``2 x layers x block_size x kv_heads x head_dim x element size`` bytes. The pool has one more
block than the memory buys, the null block (``models/paged.NULL_BLOCK``), which is small.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.kv_blocks import blocks_for
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = ["KVLayout", "format_bytes", "kv_layout", "kv_layout_for"]


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps it >= 1 (``1.5 GiB``)."""
    value, unit = float(n), "B"
    for name in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, name
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


@dataclass(frozen=True)
class KVLayout:
    """The shape of one rank's KV cache."""

    layers: int
    kv_heads: int
    """This rank's KV heads (after tensor parallelism)."""
    head_dim: int
    element_size: int
    block_size: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.element_size

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.bytes_per_token

    def blocks_for_memory(self, memory: int | None, *, rows: int, max_seq_len: int) -> int:
        """The pool's block count (the null block included) for ``memory`` bytes; None: room
        for ``rows`` sequences of ``max_seq_len`` tokens. ConfigError, naming the size needed,
        when ``memory`` cannot hold one sequence of ``max_seq_len`` tokens."""
        per_seq = blocks_for(max_seq_len, self.block_size)
        if memory is None:
            return rows * per_seq + 1
        blocks = memory // self.bytes_per_block
        if blocks < per_seq:
            need = per_seq * self.bytes_per_block
            raise ConfigError(
                f"--kv-cache-memory {memory} ({format_bytes(memory)}) holds {blocks} blocks of "
                f"{self.block_size} tokens; one request of the longest allowed length "
                f"({max_seq_len} tokens) needs {per_seq}: give at least {need} "
                f"({format_bytes(need)}), or a smaller --max-seq-len"
            )
        return blocks + 1


def kv_layout_for(
    args: ModelArgs, *, tp: int, dtype: torch.dtype, block_size: int, layers: int | None = None
) -> KVLayout:
    """The layout of a rank of a ``tp``-way tensor-parallel model (KV heads are split, or
    replicated when tp exceeds their count), before any model is built; ``layers``: a
    pipeline stage's (its deepest stage's, ``StageRole.kv_layers``), default all."""
    kv = args.n_kv_heads // tp if args.n_kv_heads >= tp else 1
    size = torch.empty((), dtype=dtype).element_size()
    return KVLayout(layers or args.n_layers, kv, args.head_dim, size, block_size)


def kv_layout(model: Transformer, block_size: int) -> KVLayout:
    """The layout of ``model`` as built on this rank (its local KV heads, its dtype; a
    pipeline stage counts the layers of the deepest stage: ``StageRole.kv_layers``; a model
    with its own ``kv_dims()``, such as ``models/hf_model.PagedHFModel``, says them)."""
    own = getattr(model, "kv_dims", None)
    if own is not None:
        layers, kv_heads, head_dim, size = own()
        return KVLayout(layers, kv_heads, head_dim, size, block_size)
    block = model.blocks[0]
    attn, size = block.attention, block.attention_norm.weight.element_size()
    return KVLayout(model.stage.kv_layers, attn.n_kv_heads, attn.head_dim, size, block_size)
