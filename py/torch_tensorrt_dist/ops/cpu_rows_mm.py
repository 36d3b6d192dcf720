"""Products of a few token rows with row-major float32 weights on the CPU: a C++ op built at
first use (``cpu_rows_mm.cpp``).

    if cpu_rows_mm.available():            # built once per machine (about 10 s), then loaded
        y = rows_mm(x, w)                  # x [M, K] @ w[N, K].t() -> [M, N], float32

A decode step of few rows, or a speculative verify call of a few rows x (k + 1) tokens, reads
every weight once and does little arithmetic with it. Inductor's reductions
(``backend/row_products.py``) keep one accumulator per output and row: each row's dot product
is its own chain of additions, and 5 token rows cost about 5 times one. The op loads each
weight vector into a register once for a block of up to 8 rows, and each row's vector once for
the block's 2 to 8 outputs (8 to 16 independent accumulators in registers), and prefetches the
weights ahead. One token row is bound by reading the weights, 5 or more by the fused
multiply-adds (one 16-lane one a cycle on one core of either CPU below). Alone, one thread
(the demo model's 29 products, in-cache weights, CPU time of a C++ loop, best of 11 blocks):

- this AMD EPYC (Zen 4, 2026-12-07, load average 2-3): 1 row 188 us, 5 rows 381, 8 rows
  697, 16 rows 1,550; 5 rows run at 78 % of the core's peak (299 us for their 1.07 M
  16-lane fused multiply-adds). Before the vectors were held in registers: 567, 869 and
  1,810 us (GCC had folded the load of each use into the product: 18 loads for 15
  products, where a Zen 4 core loads one 64-byte vector a cycle);
- the Xeon of the first form (2026-12-06, load average 11): 1 row 478 us, 5 rows 508, 8 rows
  590, 20 rows 1,324, 40 rows 2,913 (without the prefetch 5 and 8 rows cost 1.25 and 1.5
  times one row). There one row took 2.5x as long to read the weights, and 5 rows'
  arithmetic hid in that time; on the EPYC it cannot.

In a whole step the gain is smaller (docs/generation.md, speculative decoding).

Each output is the dot product of its row and the weight's row in a fixed order: a row's
result does not depend on the other rows of the call or on the threads; the values are
``mm``'s to float32 rounding. Only ``backend/row_products.py`` uses it, for the Inductor
engine (an extern kernel: the op has a fake implementation for tracing); where it cannot be
built, the products stay Inductor's reductions. It is built as ``cpu_attention``'s
(``ops/_cpp_build.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from torch_tensorrt_dist.ops._cpp_build import CppOp

__all__ = ["NAMESPACE", "available", "rows_mm"]

NAMESPACE = "tensorrt_dist_gemm"
SOURCE = Path(__file__).with_name("cpu_rows_mm.cpp")


def _fake(x: Tensor, w: Tensor) -> Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))  # contiguous, as the kernel returns it


#: where the op cannot be built (``ops/_cpp_build.py``: ``available()`` says False and why)
_FALLBACK = "products of few rows stay Inductor's reductions"
_OP = CppOp("cpu_rows_mm", SOURCE, NAMESPACE, {"rows_mm": _fake}, _FALLBACK)
library_name, available = _OP.library_name, _OP.available


def rows_mm(x: Tensor, w: Tensor) -> Tensor:
    """``x`` [M, K] @ ``w`` [N, K].t() -> [M, N], float32 on the CPU (call :func:`available`
    first)."""
    return getattr(torch.ops, NAMESPACE).rows_mm(x, w)
