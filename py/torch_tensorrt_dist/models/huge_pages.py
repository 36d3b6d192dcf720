"""A model's CPU weights moved into transparent huge pages (Linux), before its step compiles.

    moved = huge_page_weights(model)     # bytes moved; 0 where it does not apply
    huge_page_tensors(weights.values())  # the same for loose tensors (artifacts/load.py)

Why: a CPU decode step reads every weight once, so it runs at the speed the weights stream
from the caches or from memory. The serving benchmark's checkpoint holds 26 MiB of fp32
weights against a 32 MiB L3; scattered over 4 KiB pages they compete for the cache's sets
unevenly and cost a TLB entry every 4 KiB, and once a neighbour (the HTTP thread, the client
on the other core) evicts part of them, the prefetchers stop at every page edge. Measured on
that checkpoint (one thread, this AMD EPYC): in one process, two generators built alike, one
with its weights moved, steps timed in alternated blocks, each build order twice, a decode
step of one row 0.69-0.87x the time, of 8 rows 0.90-1.03x; served, one server at a time,
alternated, one client's decode tok/s 1.14x, 8 clients' 1.01x (docs/performance.md).

How: one anonymous private mapping, 2 MiB aligned and advised ``MADV_HUGEPAGE``; each storage
of the model's parameters and buffers is copied into it (64-byte aligned) as a storage of its
own over that part of the mapping, and every tensor over it rebound (``.data``) to a view of
the same size, strides and storage offset: tied weights stay tied, column-major weights stay
column-major (``weight_layout.py``). A storage of its own, not views of one storage of the
whole mapping: code that reads a tensor's bytes from its storage's start plus an offset of
its own (Inductor's C++ GEMM template packing a constant weight did, with offset 0: it packed
the mapping's first bytes, zeros) reads the same bytes as before the move. The old storage goes as
soon as nothing else holds it, so the peak is the weights plus one storage. Before the step
compiles: a compiled graph that took a tensor as a constant would keep the old one.

Only where it can help and is safe: Linux with transparent huge pages not ``never``; plain
strided CPU tensors (DTensor parameters and the paged KV pools, written every step and sized
by their own budget, stay where they are); ``TORCH_TENSORRT_DIST_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from torch_tensorrt_dist.runtime.huge_pages import system_thp_mode

__all__ = ["HUGE_PAGES_ENV", "huge_page_tensors", "huge_page_weights", "huge_pages_available"]

logger = logging.getLogger(__name__)

HUGE_PAGES_ENV = "TORCH_TENSORRT_DIST_HUGE_PAGES"
_PAGE = 2 << 20  # a transparent huge page on x86-64 and most arm64 kernels
_ALIGN = 64


def huge_pages_available(mode: str | None = None) -> bool:
    """Transparent huge pages can back an advised mapping here (Linux, the system's THP mode
    ``always`` or ``madvise``: ``mode``, default the system's), and
    ``$TORCH_TENSORRT_DIST_HUGE_PAGES`` is not ``0``."""
    if os.environ.get(HUGE_PAGES_ENV, "").strip() == "0":
        return False
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    return (mode or system_thp_mode()) in ("always", "madvise")


def _movable(t: torch.Tensor) -> bool:
    return (
        type(t) in (torch.Tensor, nn.Parameter)
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_quantized
        and t.untyped_storage().nbytes() > 0
    )


def _tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """The model's parameters and buffers (a tied weight more than once), not its pools."""
    from torch_tensorrt_dist.models.paged import PagedKVCache

    for module in model.modules():
        if not isinstance(module, PagedKVCache):
            yield from module.parameters(recurse=False)
            yield from (b for b in module.buffers(recurse=False) if b is not None)


def huge_page_weights(model: nn.Module) -> int:
    """Move the storages of ``model``'s parameters and buffers into huge pages (module
    docstring); returns the bytes moved (0: not available here, or nothing to move)."""
    return huge_page_tensors(_tensors(model))


def huge_page_tensors(tensors: Iterable[torch.Tensor]) -> int:
    """Move the storages of ``tensors`` (the plain strided CPU ones; the others are left)
    into one region of huge pages, each tensor rebound to a view of the same size, strides
    and offset there; returns the bytes moved (0: not available here, or nothing to move).
    Call it before anything takes the tensors' addresses (a compiled graph, a package's
    shared constants)."""
    if not huge_pages_available():
        return 0
    unique = {id(t): t for t in tensors if _movable(t)}
    by_storage: dict[int, list[torch.Tensor]] = {}  # the tensors over each storage
    for t in unique.values():
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    if not by_storage:
        return 0
    offsets, total = {}, 0
    for ptr, group in by_storage.items():
        offsets[ptr] = total
        total += -(-group[0].untyped_storage().nbytes() // _ALIGN) * _ALIGN
    region = mmap.mmap(-1, total + _PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    start = -torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr() % _PAGE
    with torch.no_grad():
        for ptr, group in by_storage.items():
            old = group[0].untyped_storage()  # freed once its tensors are rebound
            n = old.nbytes()
            # a storage of its own at this part of the mapping (each keeps the mapping alive)
            raw = torch.frombuffer(region, dtype=torch.uint8, count=n, offset=start + offsets[ptr])
            raw.copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            for t in group:
                t.data = raw.view(t.dtype).as_strided(t.size(), t.stride(), t.storage_offset())
            del old
    logger.debug("moved %d bytes of weights into huge pages", total)
    return total
