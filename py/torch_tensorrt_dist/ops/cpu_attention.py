"""Decode attention on the CPU read straight from the paged KV pools: a C++ op built at first use.

    if cpu_attention.available():          # built once per machine (about 10 s), then loaded
        y = decode_attention(q, k_pool, v_pool, past, k_own, v_own, mask)   # [R, Hq, 1, D]

A decode step (one query token a row) spent most of its attention outside arithmetic: the
gather of each row's past blocks into a new tensor, the concatenation of the step's own key and
value, and torch's CPU flash-attention kernel, whose set-up for one query token costs about 70 us
a layer at 8 rows of the serving benchmark's model (profiled; docs/performance.md). The op
(``cpu_decode_attention.cpp``) computes the same attention as ``models/paged.py``'s
``paged_attention`` over the gathered keys (the mask included: sliding windows, padding, the
own token) in one pass over the pools. Each (row, KV head) is computed whole by one thread in a
fixed order, so a row's output does not depend on the other rows of the step or on the threads:
a served request's greedy tokens stay those of ``generate`` alone.

Only the Inductor engine on the CPU uses it (``Generator``: ``Transformer.setup_paged(...,
cpu_decode=True)``), and only in decode steps. TensorRT engines never see it: a graph for
TensorRT keeps ``scaled_dot_product_attention`` (IAttention), and so do the eager reference
(``--engine none``) and the AOTInductor artifacts. Where the op cannot be built (no C++
compiler: then Inductor cannot compile either), the step keeps the reference form and a warning
says why.

The library's name holds a hash of its source, the compile flags, torch's version and the CPU's
instruction-set flags (it is built with ``-march=native``): a cache shared by other machines or
other torch builds never loads a library built for another.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import threading
import time
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["NAMESPACE", "available", "decode_attention", "library_name", "unavailable_reason"]

logger = logging.getLogger(__name__)

NAMESPACE = "tensorrt_dist_cpu"
SOURCE = Path(__file__).with_name("cpu_decode_attention.cpp")
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool once tried; "reason": why not


def _cpu_flags() -> str:
    """The CPU's instruction-set flags (Linux), else the machine's name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.machine() + platform.processor()


def library_name() -> str:
    """The extension's name: a hash of what the built library depends on (module docstring)."""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(CFLAGS).encode(), torch.__version__.encode()):
        h.update(part)
    h.update(_cpu_flags().encode())
    return f"torchtrt_dist_cpu_attention_{h.hexdigest()[:16]}"


def available() -> bool:
    """Build (once per machine and source) and load the op; False, with a warning saying why,
    where it cannot be built. Safe from several threads; ranks share the build by its lock."""
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _load()
        return bool(_state["ok"])


def unavailable_reason() -> str:
    """Why :func:`available` said False ("" when it did not, or was not asked)."""
    return str(_state.get("reason", ""))


def _load() -> bool:
    if hasattr(torch.ops, NAMESPACE) and hasattr(getattr(torch.ops, NAMESPACE), "decode_attention"):
        _register_fake()
        return True  # loaded by someone else in this process (a test, another import path)
    start = time.perf_counter()
    if not torch.cuda.is_available():  # its import warns that no CUDA runtime is found
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        from torch.utils.cpp_extension import load

        name = library_name()
        logger.info("CPU decode attention: building or loading %s", name)
        load(
            name=name,
            sources=[str(SOURCE)],
            extra_cflags=CFLAGS,
            is_python_module=False,
            verbose=False,
        )
    except Exception as exc:  # no compiler, a failed build: keep the reference attention
        _state["reason"] = f"{type(exc).__name__}: {str(exc).strip()[-800:]}"
        logger.warning(
            "the CPU decode-attention op could not be built; decode steps use "
            "scaled_dot_product_attention over gathered blocks (%s)",
            _state["reason"],
        )
        return False
    logger.info("CPU decode attention ready in %.1f s", time.perf_counter() - start)
    _register_fake()
    return True


def _register_fake() -> None:
    if _state.get("fake"):
        return

    @torch.library.register_fake(f"{NAMESPACE}::decode_attention")
    def _(q: Tensor, *rest: object) -> Tensor:  # the kernel checks the others (C++)
        return q.new_empty(q.shape)  # contiguous, as the kernel returns it

    _state["fake"] = True


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
    """q [R, Hq, 1, D], pools [N, bs, Hkv, D], past [R, NB], own K/V [R, Hkv, 1, D], mask
    [R, 1, 1, NB * bs + 1] -> [R, Hq, 1, D] (``cpu_decode_attention.cpp``; call
    :func:`available` first). ``scale``: default 1 / sqrt(D), as
    ``scaled_dot_product_attention``'s."""
    s = q.shape[-1] ** -0.5 if scale is None else scale
    op = getattr(torch.ops, NAMESPACE).decode_attention
    return op(q, k_pool, v_pool, past, k_own, v_own, mask, s)
