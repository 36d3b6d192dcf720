"""Rotary position embeddings in Hugging Face's ``rotate_half`` layout (halves repeated), with
Llama-3 or linear frequency scaling."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = ["apply_rope", "apply_rope_flipped", "rope_inv_freq", "rope_tables"]


def rope_inv_freq(args: ModelArgs) -> Tensor:
    """Inverse frequencies [head_dim // 2], with Llama-3 or linear scaling applied."""
    d = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = args.rope_scaling
    if s is None:
        return inv_freq
    if s.kind == "linear":
        return inv_freq / s.factor
    # Llama 3.1: long wavelengths slowed by `factor`, short kept, a smooth band in between.
    old_len = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / s.low_freq_factor, old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(args: ModelArgs, max_seq_len: int) -> tuple[Tensor, Tensor]:
    """cos, sin: [max_seq_len, head_dim] in float32, rotate_half layout (halves repeated)."""
    t = torch.arange(max_seq_len, dtype=torch.float32)
    freqs = torch.outer(t, rope_inv_freq(args))  # [L, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [L, D]
    return emb.cos(), emb.sin()


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [B, H, S, D], cos/sin: [B, S, D] (already in x's dtype)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


def apply_rope_flipped(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """:func:`apply_rope` with ``rotate_half`` as a flip of the halves and a sign (the same
    values: only exact negations differ in where they happen), for q / k that come out of a
    reduction (Qwen3's per-head RMSNorm). On the CPU Inductor lowers ``cat`` to a buffer of its
    own, which a reduction before it cannot fuse into: one more kernel per q and k and layer
    (a Qwen3 decode step ran 26 kernels to a Llama one's 18 of the same shape, 22 this way).
    Behind plain projections (Llama) ``cat`` fuses and writes in place: that stays."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    sign = torch.arange(2, dtype=x.dtype, device=x.device)[:, None] * 2 - 1  # [[-1], [1]]
    rotated = (x.unflatten(-1, (2, -1)).flip(-2) * sign).flatten(-2)  # cat((-x2, x1), -1)
    return x * cos + rotated * sin
