"""Products of a few token rows with row-major float32 weights on the CPU: a C++ op built at
first use (``cpu_rows_mm.cpp``).

    if cpu_rows_mm.available():            # built once per machine (about 10 s), then loaded
        y = rows_mm(x, w)                  # x [M, K] @ w[N, K].t() -> [M, N], float32

A decode step of few rows, or a speculative verify call of a few rows x (k + 1) tokens, reads
every weight once and does little arithmetic with it. Inductor's reductions
(``backend/row_products.py``) keep one accumulator per output and row: each row's dot product
is its own chain of additions, and 5 token rows cost about 5 times one. The op loads each
weight vector once for a block of up to 8 rows (up to 24 independent accumulators in
registers) and prefetches the weights ahead, so that the arithmetic of several rows hides in
the time the weights take to come. Alone, one thread of this Xeon (the demo model's 28 layer
products, in-cache weights, CPU time of a C++ loop): 1 row 478 us, 5 rows 508, 8 rows 590,
20 rows 1,324, 40 rows 2,913 (without the prefetch 5 and 8 rows cost 1.25 and 1.5 times one
row). In a whole decode step the gain is smaller (docs/generation.md, speculative decoding).

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
