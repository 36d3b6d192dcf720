"""Small reference models for tests, examples and ``explain`` (not LLMs: see ``llama``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "NormMLP"]


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
