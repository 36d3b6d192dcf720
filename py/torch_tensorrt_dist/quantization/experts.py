"""Quantized mixture-of-experts MLPs and Qwen3's q/k projections with a per-head norm.

:class:`QuantizedSparseMoE` takes the place of a ``models.moe.SparseMoE`` after loading: each
local expert's gate/up/down matrices (this rank's TP slice of them) become weight-only codes,
quantized expert by expert exactly as a dense layer's, and the router stays in the model
dtype (its top-k decides which experts run). Every local expert runs for every token, weighted
by its routing weight (zero where the token was not routed there): exact, static-shape, and
each expert reads its weights through the weight-only kernel instead of gathering a dequantized
copy of the chosen experts.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn

from torch_tensorrt_dist.lowering.freeze_constants import mark_frozen
from torch_tensorrt_dist.models.llama import QKNormLinear
from torch_tensorrt_dist.models.moe import SparseMoE, route
from torch_tensorrt_dist.quantization.kernels import compute_dtype
from torch_tensorrt_dist.quantization.modules import (
    WeightOnlyLinear,
    quantize_matrix,
    quantized_matmul,
)
from torch_tensorrt_dist.quantization.scheme import QuantConfig

__all__ = ["QuantizedQKNormLinear", "QuantizedSparseMoE", "is_qk_norm", "quantize_experts"]


def is_qk_norm(linear: nn.Module) -> bool:
    return isinstance(linear, QKNormLinear)


class QuantizedQKNormLinear(WeightOnlyLinear):
    """:class:`WeightOnlyLinear` followed by RMSNorm over each head's ``head_dim`` values."""

    head_dim: int
    norm: nn.Module

    @classmethod
    def from_qk_norm(
        cls, linear: nn.Linear, config: QuantConfig, *, kind: str
    ) -> QuantizedQKNormLinear:
        out = cast(QuantizedQKNormLinear, cls.from_linear(linear, config, kind=kind))
        out.head_dim = int(cast(QKNormLinear, linear).head_dim)
        out.norm = cast(QKNormLinear, linear).norm
        return out

    def forward(self, x: Tensor) -> Tensor:
        y = super().forward(x)  # [..., H * D]
        return self.norm(y.unflatten(-1, (-1, self.head_dim))).flatten(-2)


def _stack(
    experts: Tensor, config: QuantConfig, kind: str, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """[E, N, K] float -> codes [E, ...] and scales [E, ...], one expert at a time."""
    codes, scales = [], []
    for w in experts:
        q, s = quantize_matrix(w, config, kind, dtype)
        codes.append(q)
        scales.append(s)
    return torch.stack(codes), torch.stack(scales)


class QuantizedSparseMoE(nn.Module):
    """A :class:`SparseMoE` with its routed experts stored as weight-only codes.

    ``w1``/``w3``: codes of [E_local, I_local, D], ``w2``: of [E_local, D, I_local], each with
    its ``*_scales``; router, shared expert and group are the original module's.
    """

    def __init__(self, moe: SparseMoE, config: QuantConfig, kind: str) -> None:
        super().__init__()
        dtype = compute_dtype(moe.w1.device.type, moe.w1.dtype)
        self.n_experts, self.top_k, self.norm_topk_prob = (
            moe.n_experts,
            moe.top_k,
            moe.norm_topk_prob,
        )
        self.gate, self.shared = moe.gate, moe.shared
        self.expert_start = moe.expert_start
        self.group: dist.ProcessGroup | None = moe.group
        self.kind, self.group_size = kind, config.group
        self.local_experts = moe.w1.shape[0]
        self.dims = (moe.w1.shape[2], moe.w1.shape[1])  # (D, I_local)
        for name in ("w1", "w3", "w2"):
            q, s = _stack(getattr(moe, name).detach(), config, kind, dtype)
            self.register_buffer(name, q)
            self.register_buffer(f"{name}_scales", s)
            mark_frozen(q, s)

    def _mm(self, x: Tensor, name: str, e: int) -> Tensor:
        w, s = getattr(self, name)[e], getattr(self, f"{name}_scales")[e]
        return quantized_matmul(x.to(s.dtype), w, s, self.kind, self.group_size)

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, S, D] -> [B, S, D]
        b, s, d = x.shape
        h = x.reshape(b * s, d)  # [T, D]
        weights = route(
            self.gate(h), self.top_k, self.norm_topk_prob, self.expert_start, self.local_experts
        )  # [T, E_local] float32, 0 where not routed
        out = torch.zeros_like(h)
        for e in range(self.local_experts):
            y = self._mm(F.silu(self._mm(h, "w1", e)) * self._mm(h, "w3", e), "w2", e)  # [T, D]
            out = out + y.to(h.dtype) * weights[:, e : e + 1].to(h.dtype)
        if self.shared is not None:
            out = out + self.shared(h)
        if self.group is not None:
            out = funcol.all_reduce(out, "sum", self.group)
        return out.view(b, s, d)


def quantize_experts(model: nn.Module, config: QuantConfig, kind: str) -> tuple[int, int]:
    """Replace every ``SparseMoE`` of ``model`` (its shared expert's linears are handled as
    dense ones); returns (bytes before, bytes after) of the routed experts."""
    before = after = 0
    for _, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, SparseMoE):
                continue
            before += sum(getattr(child, n).nbytes for n in ("w1", "w3", "w2"))
            quantized = QuantizedSparseMoE(child, config, kind)
            after += sum(
                getattr(quantized, n).nbytes
                for n in ("w1", "w3", "w2", "w1_scales", "w3_scales", "w2_scales")
            )
            setattr(parent, child_name, quantized)
    return before, after
