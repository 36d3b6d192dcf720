"""The interpreter while a rank serves: the step loop's thread switch interval, and the heap
that the load and the warm-up left, frozen out of the garbage collector's scans.

    settle_heap()                                      # after the warm-up, on every rank
    with gil_switch(switch_interval(run.engine)):      # rank 0, around the step loop
        leader.run()
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
from collections.abc import Iterator

__all__ = ["GIL_SWITCH_HELD_S", "GIL_SWITCH_S", "gil_switch", "settle_heap", "switch_interval"]

logger = logging.getLogger(__name__)

#: Rank 0's thread switch interval while serving (Python's default is 5 ms; measured when the
#: HTTP server ran in a thread of rank 0; the pipe's reader and writer threads share the lock
#: now). The step loop
#: releases the interpreter lock (GIL) inside every kernel (``backend/kernel_gil.py``), matmul
#: and collective, and the HTTP thread runs then; when the loop comes back while the HTTP
#: thread holds the lock, it waits until the HTTP thread's interval ends (every other rank
#: waiting with it). 50 us bounds that wait per handover: the kernels released at 50 us gave
#: eight streaming clients 1.01-1.10x the tokens/s over five alternated runs, at 0.5 ms 0.99x
#: (docs/performance.md).
GIL_SWITCH_S = 5e-5
#: The interval where Inductor's kernels keep the lock (``kernel_gil.released()`` is False):
#: the loop then runs Python-held stretches that a short interval would cut into (50 us was
#: 7 % slower than 0.5 ms there).
GIL_SWITCH_HELD_S = 5e-4


def settle_heap() -> int:
    """Collect, then move every object the load and the warm-up made out of the garbage
    collector's reach (``gc.freeze``); return how many. Dynamo's and Inductor's compiles leave
    hundreds of thousands of long-lived objects, and a full collection scanning them stopped
    the step loop for 474 ms in the middle of serving (a 490 ms gap in every stream and a
    569 ms p99 time to first token at 32 clients). Frozen, they are
    never scanned again; what serving allocates is collected as before."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("%d objects of the load and warm-up frozen (out of the collector's scans)", frozen)
    return frozen


def switch_interval(engine: str) -> float:
    """The step loop's switch interval: short where its kernels release the GIL."""
    from torch_tensorrt_dist.backend.kernel_gil import released

    return GIL_SWITCH_S if engine != "inductor" or released() else GIL_SWITCH_HELD_S


@contextlib.contextmanager
def gil_switch(interval_s: float) -> Iterator[None]:
    """Python's thread switch interval set to ``interval_s`` while the step loop runs."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    try:
        yield
    finally:
        sys.setswitchinterval(saved)
