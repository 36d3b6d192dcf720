"""Quantized stand-ins for the model's ``nn.Linear`` and vocabulary embedding.

    layer = WeightOnlyLinear.from_linear(linear, config, kind="int8")   # replaces ``linear``
    embed = QuantizedEmbedding.from_embedding(model.tok_embeddings)      # int8, one scale per row

Buffers, not parameters: ``weight`` holds the codes (int8 [N, K], or packed int4) and
``scales`` the scales, in the layout of ``kind`` (``kernels.weight_only_mm``) and in the
dtype the matmul computes in (``kernels.compute_dtype``: bfloat16 on CPU); the input is cast
to it and the output back to the model dtype. A bias stays in the model dtype.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from torch_tensorrt_dist.lowering.freeze_constants import mark_frozen
from torch_tensorrt_dist.models.vocab import embed_tokens
from torch_tensorrt_dist.quantization.kernels import KERNEL_ROWS, compute_dtype, weight_only_mm
from torch_tensorrt_dist.quantization.scheme import QuantConfig
from torch_tensorrt_dist.quantization.tensors import (
    pack_int4,
    quantize_int4,
    quantize_int8,
    to_cpu_int4,
)

__all__ = ["QuantizedEmbedding", "WeightOnlyLinear", "quantize_matrix", "quantized_matmul"]


def quantize_matrix(
    w: Tensor, config: QuantConfig, kind: str, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """(stored weight, stored scales) of ``w`` [N, K] in layout ``kind``; scales in ``dtype``."""
    if kind == "int8":
        q, s = quantize_int8(w)
        return q, s.to(dtype)
    q, s = quantize_int4(w, config.group)
    if kind == "int4_cpu":
        return to_cpu_int4(q, s, dtype)
    return pack_int4(q), s.to(dtype)


def quantized_matmul(
    x: Tensor,
    weight: Tensor,
    scales: Tensor,
    kind: str,
    group_size: int,
    dense_rows: int | None = KERNEL_ROWS,
) -> Tensor:
    """``x`` [M, K] (in the scales' dtype) -> [M, N]: the weight-only kernel, except an int8
    matmul of more than ``dense_rows`` rows (prefill), which dequantizes the matrix once and
    runs a dense GEMM (``None``: the kernel at every size, for TensorRT, which converts the
    kernel's op into its own weight-only layer and keeps the int8 weights)."""
    if kind == "int8" and dense_rows is not None and _many_rows(x.shape[0], dense_rows):
        return F.linear(x, weight.to(x.dtype) * scales[:, None])
    return weight_only_mm(x, weight, scales, kind, group_size)


def _many_rows(rows: int | torch.SymInt, limit: int) -> bool:
    """More than ``limit`` rows. A traced step's dynamic row count decides once per graph,
    with no guard (a guard would split the range its inputs were marked with, which Dynamo
    refuses): the kernel where every size the range allows fits (a decode graph of up to
    ``limit`` rows), else the dense GEMM (a prefill graph's chunks)."""
    if not torch.compiler.is_compiling():
        return bool(rows > limit)
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return not statically_known_true(rows <= limit)


class WeightOnlyLinear(nn.Module):
    """``y = x @ W.T (+ b)`` with ``W`` stored quantized; x: [..., K] -> [..., N]."""

    weight: Tensor
    scales: Tensor
    #: an int8 matmul of more rows dequantizes (``quantized_matmul``); ``quantize_model`` sets
    #: None for the TensorRT engine
    dense_rows: int | None = KERNEL_ROWS

    def __init__(
        self,
        in_features: int,
        out_features: int,
        weight: Tensor,
        scales: Tensor,
        *,
        kind: str,
        group_size: int = 0,
        bias: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.kind, self.group_size = kind, group_size
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        mark_frozen(weight, scales)  # constants of a TensorRT engine
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, config: QuantConfig, *, kind: str) -> WeightOnlyLinear:
        w = linear.weight.detach()
        q, s = quantize_matrix(w, config, kind, compute_dtype(w.device.type, w.dtype))
        bias = None if linear.bias is None else linear.bias.detach()
        n, k = w.shape  # this rank's slice (a sharded nn.Linear keeps its full-size fields)
        return cls(k, n, q, s, kind=kind, group_size=config.group, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        # x: [..., K] (model dtype) -> [..., N]; the matmul runs in the scales' dtype
        x2 = x.reshape(-1, self.in_features).to(self.scales.dtype)  # [M, K]
        y = quantized_matmul(
            x2, self.weight, self.scales, self.kind, self.group_size, self.dense_rows
        )
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.group_size else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"kind={self.kind}{group}, bias={self.bias is not None}"
        )


class QuantizedEmbedding(nn.Module):
    """A (vocabulary-parallel) embedding stored as int8 rows with one scale per row; as a tied
    LM head, ``Transformer`` multiplies by it through ``aten._weight_int8pack_mm``."""

    weight: Tensor
    scales: Tensor

    def __init__(self, weight: Tensor, scales: Tensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        mark_frozen(weight, scales)
        self.group: dist.ProcessGroup | None = None
        self.start = 0

    @classmethod
    def from_embedding(cls, embedding: nn.Module) -> QuantizedEmbedding:
        w = cast(Tensor, embedding.weight).detach()
        q, s = quantize_int8(w)
        out = cls(q, s.to(w.dtype))
        out.group = getattr(embedding, "group", None)
        out.start = getattr(embedding, "start", 0)
        return out

    def forward(self, tokens: Tensor) -> Tensor:
        return embed_tokens(tokens, self.weight, self.group, self.start, scales=self.scales)
