"""Small reference models for tests, examples and ``explain`` (not LLMs: see ``llama``), and
:class:`ToyLM`, the decoder of the toy family (``families/toy.py``: docs/families.md's example
of a family that is its model file, its TP plan and its spec)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torch_tensorrt_dist.models.llama import ModelArgs, Transformer, TransformerBlock
from torch_tensorrt_dist.models.paged import PagedSlots

__all__ = ["MLP", "NormMLP", "ParallelBlock", "ToyLM"]


class MLP(nn.Module):
    """``w2(gelu(w1(x)))``: the tensor-parallel unit (w1 column-, w2 row-parallel)."""

    def __init__(self, dim: int = 64, hidden: int = 256, bias: bool = True) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=bias)
        self.w2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., dim] -> [..., hidden] -> [..., dim]
        return self.w2(F.gelu(self.w1(x)))


class NormMLP(nn.Module):
    """A pre-norm residual MLP block: the unit of a sequence-parallel plan."""

    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = MLP(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, dim]
        return x + self.mlp(self.norm(x))


class Attention(nn.Module):
    """Causal multi-head self-attention; head count taken from the projection's local width,
    so it runs unchanged when q/k/v are column-sharded (each rank holds n_heads/tp heads)."""

    def __init__(self, dim: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # [B, S, local heads * hd] -> [B, local heads, S, hd]
        q, k, v = (
            proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            for proj in (self.wq, self.wk, self.wv)
        )
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, S, hd]
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    """A pre-norm transformer block: attention and MLP, each with a residual."""

    def __init__(self, dim: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ParallelBlock(TransformerBlock):
    """GPT-J's block: attention and MLP side by side on one norm,
    ``x + attention(norm(x)) + mlp(norm(x))`` (no ``ffn_norm``)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        del self.ffn_norm

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        where: torch.Tensor | PagedSlots,
    ) -> torch.Tensor:
        h = self.attention_norm(x)  # [B, S, dim]
        return x + self.attention(h, cos, sin, mask, where) + self.feed_forward(h)


class ToyLM(Transformer):
    """A decoder of :class:`ParallelBlock` layers; everything else (embedding, RoPE, the paged
    KV cache, the LM head, pipeline stages) is :class:`Transformer`'s."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        self.layers = nn.ModuleList(ParallelBlock(args) for _ in range(args.n_layers))
