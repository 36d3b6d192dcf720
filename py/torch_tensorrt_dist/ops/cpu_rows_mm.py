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
built, the products stay Inductor's reductions. The library's name holds a hash of its
source, the compile flags, torch's version and the CPU's flags, as ``cpu_attention``'s.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

import torch
from torch import Tensor

from torch_tensorrt_dist.ops.cpu_attention import CFLAGS, _cpu_flags

__all__ = ["NAMESPACE", "available", "rows_mm"]

logger = logging.getLogger(__name__)

NAMESPACE = "tensorrt_dist_gemm"
SOURCE = Path(__file__).with_name("cpu_rows_mm.cpp")

_lock = threading.Lock()
_state: dict[str, object] = {}


def library_name() -> str:
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(CFLAGS).encode(), torch.__version__.encode()):
        h.update(part)
    h.update(_cpu_flags().encode())
    return f"torchtrt_dist_cpu_rows_mm_{h.hexdigest()[:16]}"


def available() -> bool:
    """Build (once per machine and source) and load the op; False, with a warning saying why,
    where it cannot be built. Safe from several threads."""
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _load()
        return bool(_state["ok"])


def _load() -> bool:
    if not (hasattr(torch.ops, NAMESPACE) and hasattr(getattr(torch.ops, NAMESPACE), "rows_mm")):
        if not torch.cuda.is_available():  # its import warns that no CUDA runtime is found
            logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        try:
            from torch.utils.cpp_extension import load

            load(
                name=library_name(),
                sources=[str(SOURCE)],
                extra_cflags=CFLAGS,
                is_python_module=False,
                verbose=False,
            )
        except Exception as exc:  # no compiler, a failed build: Inductor's reductions stay
            _state["reason"] = f"{type(exc).__name__}: {str(exc).strip()[-800:]}"
            logger.warning(
                "the CPU rows_mm op could not be built; products of few rows stay "
                "Inductor's reductions (%s)",
                _state["reason"],
            )
            return False

    @torch.library.register_fake(f"{NAMESPACE}::rows_mm")
    def _(x: Tensor, w: Tensor) -> Tensor:
        return x.new_empty((x.shape[0], w.shape[0]))  # contiguous, as the kernel returns it

    return True


def rows_mm(x: Tensor, w: Tensor) -> Tensor:
    """``x`` [M, K] @ ``w`` [N, K].t() -> [M, N], float32 on the CPU (call :func:`available`
    first)."""
    return getattr(torch.ops, NAMESPACE).rows_mm(x, w)
