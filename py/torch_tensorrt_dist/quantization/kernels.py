"""The weight-only matmuls: one call per quantized layer, in the form each engine compiles well.

    y = weight_only_mm(x2d, weight, scales, kind, group_size)     # x2d [M, K] -> [M, N]

Kinds (the stored layout of ``weight`` / ``scales``):

- ``int8``: int8 [N, K] / [N] -> ``aten._weight_int8pack_mm`` (CPU and CUDA kernels, an
  AOTInductor C shim; ``modules.WeightOnlyLinear`` dequantizes instead above ``KERNEL_ROWS``
  rows). This is the op Inductor itself rewrites gpt-fast's
  ``linear(x, w.to(x.dtype)) * scales`` into, but only for bfloat16 activations: in float32
  that form becomes a dequantized copy of the matrix and a dense matmul. Calling the op
  directly gives the weight-only kernel for every dtype and every engine.
- ``int4_cpu``: torch's CPU int4 layout (``tensors.to_cpu_int4``) ->
  ``aten._weight_int4pack_mm_for_cpu``.
- ``int4_nibbles``: uint8 [N, K / 2] (``tensors.pack_int4``) / [N, K / g] ->
  ``torch.ops.tensorrt_dist.int4_weight_only_mm``, which our TensorRT converter turns into an
  INT4 block dequantize feeding the matmul. Its PyTorch kernel (the eager reference, and what
  runs if a node stays out of TensorRT) dequantizes the matrix first: correct, not fast.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torch_tensorrt_dist.quantization.tensors import unpack_int4

__all__ = ["KERNEL_ROWS", "KINDS", "compute_dtype", "int4_weight_only_mm", "weight_only_mm"]

KINDS = ("int8", "int4_cpu", "int4_nibbles")
#: Up to this many rows (decode, small batches) an int8 layer runs the weight-only kernel;
#: above it (prefill) the matmul is compute-bound, and one dequantized matrix feeding a dense
#: GEMM is far faster on CPU (bfloat16 GEMMs use AMX; the weight-only kernel does not).
KERNEL_ROWS = 32

_aten = torch.ops.aten


@torch.library.custom_op("tensorrt_dist::int4_weight_only_mm", mutates_args=())
def int4_weight_only_mm(x: Tensor, weight: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """``x`` [M, K] @ dequantized(``weight`` uint8 [N, K / 2], ``scales`` [N, K / g]).T."""
    codes = unpack_int4(weight).to(x.dtype)  # [N, K]
    w = codes * scales.to(x.dtype).repeat_interleave(group_size, dim=1)
    return x @ w.t()


@int4_weight_only_mm.register_fake
def _(x: Tensor, weight: Tensor, scales: Tensor, group_size: int) -> Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The activations' dtype inside a weight-only matmul. On CPU, bfloat16 whatever the
    model dtype: torch's CPU weight-only kernels are vectorised for bfloat16 only (their
    float32 path measured 250x slower than a dense float32 matmul for one row here). On other
    devices, the model dtype."""
    return torch.bfloat16 if device_type == "cpu" else dtype


def weight_only_mm(x: Tensor, weight: Tensor, scales: Tensor, kind: str, group_size: int) -> Tensor:
    """``x`` [M, K] -> [M, N] with the weight in layout ``kind`` (see the module docstring)."""
    if kind == "int8":
        return _aten._weight_int8pack_mm(x, weight, scales)
    if kind == "int4_cpu":
        return _aten._weight_int4pack_mm_for_cpu(x, weight, group_size, scales)
    if kind == "int4_nibbles":
        return int4_weight_only_mm(x, weight, scales, group_size)
    raise ValueError(f"unknown weight-only kind {kind!r}; expected one of {KINDS}")
