"""Grammar bitmasks applied to CPU logits in one pass: a C++ op built at first use
(``cpu_bitmask.cpp``).

    if cpu_bitmask.ready():                       # built and loaded (never waits: see below)
        x = masked_float(logits, bitmask, rows)   # float32 [N, V], -inf outside each grammar

``x`` is what the sampler's reference path gives (``torch.add(logits, forbidden(bitmask))``,
``generation/grammar_masks.py``), value for value, for float32, bfloat16 and float16 logits:
the grammar rows ``rows`` masked by their bitmask rows (llguidance's layout), the other rows
copied (the bitmask's other rows are not read, so a step can reuse one bitmask buffer). A step
of 8 rows then takes one op where the reference takes the bitmask's expansion (a table lookup
per mask byte: 50-60 us once the caches are cold after the graph) and an add.

:func:`ready` never builds on the caller's thread: the first call starts the build (or the
load of a library built before) on a thread of its own and says False until it is done; the
sampler keeps its reference path meanwhile (the same values). :func:`available` builds and
waits (tests, benches). It is built as ``cpu_rows_mm``'s (``ops/_cpp_build.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from torch_tensorrt_dist.ops._cpp_build import CppOp

__all__ = ["NAMESPACE", "available", "masked_float", "ready"]

NAMESPACE = "tensorrt_dist_mask"
SOURCE = Path(__file__).with_name("cpu_bitmask.cpp")


def _fake(logits: Tensor, bitmask: Tensor, rows: Sequence[int]) -> Tensor:
    return logits.new_empty(logits.shape, dtype=torch.float32)


_FALLBACK = "grammar masks are applied by the table lookup and add of grammar_masks.py"
_OP = CppOp("cpu_bitmask", SOURCE, NAMESPACE, {"masked_float": _fake}, _FALLBACK)
library_name, available = _OP.library_name, _OP.available

_state: list[bool | None] = [None]  # None: not asked yet; False: under way or failed
_start = threading.Lock()


def ready() -> bool:
    """Whether the op is loaded; the first call starts its build or load on a daemon thread
    (a fresh machine builds it in 10-60 s) and says False, as every call does until then."""
    if _state[0] is None:
        with _start:
            if _state[0] is None:
                _state[0] = False
                threading.Thread(target=_load, name="cpu-bitmask-build", daemon=True).start()
    return bool(_state[0])


def _load() -> None:
    _state[0] = available()


def masked_float(logits: Tensor, bitmask: Tensor, rows: Sequence[int]) -> Tensor:
    """float32 [N, V]: ``logits`` [N, V] (float32, bfloat16, float16; CPU) plus -inf where
    bitmask row ``i`` (int32 [>= N, ceil(V / 32)], contiguous) forbids the token, for each
    ``i`` in ``rows``; the other rows copied (call :func:`ready` or :func:`available` first)."""
    fn = _FN[0]
    if fn is None:  # the overload itself: a step's call skips the packet's dispatch in Python
        fn = _FN[0] = torch.ops.tensorrt_dist_mask.masked_float.default
    return fn(logits, bitmask, rows)


_FN: list[Callable[..., Tensor] | None] = [None]
