"""Symmetric weight-only quantization of one matrix, and the int4 storage layouts (pure torch).

    q, s = quantize_int8(w)               # w [N, K] ~ q * s[:, None]
    q, s = quantize_int4(w, 128)          # w [N, K] ~ q * s.repeat_interleave(128, 1)
    packed = pack_int4(q)                 # [N, K/2] uint8, element 2j in the low nibble
    packed, scales_zeros = to_cpu_int4(q, s, torch.bfloat16)   # torch's CPU kernel layout

Rows are processed in chunks, so quantizing a matrix needs one chunk of float temporaries,
not a float copy of the whole matrix. Scales are returned in float32; callers store them in
the dtype the kernel wants (the activations' dtype).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "dequantize_int4",
    "dequantize_int8",
    "pack_int4",
    "quantize_int4",
    "quantize_int8",
    "to_cpu_int4",
    "unpack_int4",
]

#: a zero row (or group) gets this scale, so its codes are 0 and dividing by it is safe
_TINY = 1e-12
_CHUNK_ROWS = 1024


def quantize_int8(w: Tensor) -> tuple[Tensor, Tensor]:
    """``w`` [N, K] float -> (codes int8 [N, K] in [-127, 127], scales float32 [N])."""
    if w.dim() != 2:
        raise ValueError(f"quantize_int8 takes a 2-D weight, got shape {list(w.shape)}")
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scales = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for start in range(0, w.shape[0], _CHUNK_ROWS):
        rows = w[start : start + _CHUNK_ROWS].float()
        s = (rows.abs().amax(dim=1) / 127).clamp_(min=_TINY)
        q[start : start + _CHUNK_ROWS] = torch.round(rows / s[:, None]).clamp_(-127, 127)
        scales[start : start + _CHUNK_ROWS] = s
    return q, scales


def quantize_int4(w: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """``w`` [N, K] float -> (codes int8 [N, K] in [-7, 7], scales float32 [N, K / g]).

    One scale per group of ``group_size`` consecutive input columns: its largest magnitude
    maps to 7 (symmetric, no zero point, as TensorRT's dequantize requires).
    """
    if w.dim() != 2 or w.shape[1] % group_size:
        raise ValueError(
            f"quantize_int4 takes [N, K] with K divisible by {group_size}, got {list(w.shape)}"
        )
    n, k = w.shape
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scales = torch.empty(n, k // group_size, dtype=torch.float32, device=w.device)
    for start in range(0, n, _CHUNK_ROWS):
        groups = w[start : start + _CHUNK_ROWS].float().unflatten(1, (-1, group_size))
        s = (groups.abs().amax(dim=2) / 7).clamp_(min=_TINY)  # [rows, K/g]
        codes = torch.round(groups / s[..., None]).clamp_(-8, 7)
        q[start : start + _CHUNK_ROWS] = codes.flatten(1)
        scales[start : start + _CHUNK_ROWS] = s
    return q, scales


def dequantize_int8(q: Tensor, scales: Tensor) -> Tensor:
    """float32 [N, K] from int8 codes and per-row scales (the reference)."""
    return q.float() * scales.float()[:, None]


def dequantize_int4(q: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """float32 [N, K] from int4 codes (one per int8) and group scales [N, K / g]."""
    return q.float() * scales.float().repeat_interleave(group_size, dim=1)


def pack_int4(q: Tensor) -> Tensor:
    """int4 codes [N, K] (int8 in [-8, 7]) -> uint8 [N, K / 2]: element ``2j`` of a row in
    the low nibble of byte ``j``, ``2j + 1`` in the high one, two's complement (TensorRT's and
    ONNX's INT4 packing)."""
    if q.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even number of columns, got {q.shape[-1]}")
    nib = q.to(torch.int16) & 0xF
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: Tensor) -> Tensor:
    """Inverse of :func:`pack_int4`: uint8 [N, K / 2] -> int8 codes [N, K]."""
    p = packed.to(torch.int16)
    lo, hi = p & 0xF, (p >> 4) & 0xF
    both = torch.stack((lo, hi), dim=-1).flatten(-2)  # [N, K], element 2j then 2j + 1
    return torch.where(both >= 8, both - 16, both).to(torch.int8)


def to_cpu_int4(q: Tensor, scales: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Codes [N, K] and scales [N, K / g] in the layout of torch's CPU int4 kernel
    (``aten._weight_int4pack_mm_for_cpu``): weights packed by
    ``aten._convert_weight_to_int4pack_for_cpu`` (unsigned codes, ``q + 8``), and
    ``scales_and_zeros`` [K / g, N, 2] in the activations' dtype with zero points 0 (the
    kernel computes ``(u - 8) * scale + zero``). Needs N divisible by 16."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        (q.to(torch.int32) + 8).contiguous(), 1
    )
    s = scales.t().to(dtype)  # [K/g, N]
    scales_and_zeros = torch.stack((s, torch.zeros_like(s)), dim=-1).contiguous()
    return packed, scales_and_zeros
