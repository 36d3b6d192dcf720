"""Decode attention on the CPU read straight from the paged KV pools: a C++ op built at first use.

    if cpu_attention.available():          # built once per machine (about 10 s), then loaded
        y = decode_attention(q, k_pool, v_pool, past, k_own, v_own, mask)   # [R, Hq, S, D]

A decode step (one query token a row) spent most of its attention outside arithmetic: the
gather of each row's past blocks into a new tensor, the concatenation of the step's own key and
value, and torch's CPU flash-attention kernel, whose set-up for one query token costs about 70 us
a layer at 8 rows of the serving benchmark's model (profiled; docs/performance.md). The op
(``cpu_decode_attention.cpp``) computes the same attention as ``models/paged.py``'s
``paged_attention`` over the gathered keys (the mask included: sliding windows, padding, the
own token) in one pass over the pools. Each (row, KV head) is computed whole by one thread in a
fixed order, so a row's output does not depend on the other rows of the step or on the threads:
a served request's greedy tokens stay those of ``generate`` alone.

The same op takes a few query tokens a row (S of them, query s seeing the row's past and its
own tokens <= s under the mask, each query computed as a one-token query over the keys it
sees): speculative decoding's verify call (S = k + 1 <= 17, ``PagedSlots.few``), where the
gather of the past and ``scaled_dot_product_attention`` cost a 1-row verify call most of its
extra over a decode step (``docs/generation.md``).

Only the Inductor engine on the CPU uses it (``Generator``: ``Transformer.setup_paged(...,
cpu_decode=True)``), and only in decode steps and verify calls. TensorRT engines never see it:
a graph for TensorRT keeps ``scaled_dot_product_attention`` (IAttention), and so do the eager
reference (``--engine none``) and the AOTInductor artifacts. Where the op cannot be built (no
C++ compiler: then Inductor cannot compile either), the steps keep the reference form and a
warning says why.

The library's name holds a hash of its source, the compile flags, torch's version and the CPU's
instruction-set flags (it is built with ``-march=native``): a cache shared by other machines or
other torch builds never loads a library built for another (``ops/_cpp_build.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from torch_tensorrt_dist.ops._cpp_build import CppOp

__all__ = ["NAMESPACE", "available", "decode_attention", "library_name", "unavailable_reason"]

NAMESPACE = "tensorrt_dist_cpu"
SOURCE = Path(__file__).with_name("cpu_decode_attention.cpp")


def _fake(q: Tensor, *rest: object) -> Tensor:  # the kernel checks the others (C++)
    return q.new_empty(q.shape)  # contiguous, as the kernel returns it


#: where the op cannot be built (``ops/_cpp_build.py``: ``available()`` says False and why)
_FALLBACK = "decode steps and verify calls use scaled_dot_product_attention over gathered blocks"
_OP = CppOp("cpu_attention", SOURCE, NAMESPACE, {"decode_attention": _fake}, _FALLBACK)
library_name, available = _OP.library_name, _OP.available
unavailable_reason = _OP.unavailable_reason


def decode_attention(
    q: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    past: Tensor,
    k_own: Tensor,
    v_own: Tensor,
    mask: Tensor,
    scale: float | None = None,
) -> Tensor:
    """q [R, Hq, S, D], pools [N, bs, Hkv, D], past [R, NB], own K/V [R, Hkv, S, D], mask
    [R, 1, S, NB * bs + S] -> [R, Hq, S, D] (``cpu_decode_attention.cpp``; call
    :func:`available` first). ``scale``: default 1 / sqrt(D), as
    ``scaled_dot_product_attention``'s."""
    s = q.shape[-1] ** -0.5 if scale is None else scale
    op = getattr(torch.ops, NAMESPACE).decode_attention
    return op(q, k_pool, v_pool, past, k_own, v_own, mask, s)
