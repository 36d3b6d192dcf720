"""Transparent huge pages (Linux) for torch's CPU tensors: the allocator's hint for each rank's
large allocations, and a model's weights moved into one advised region before its step compiles.

    state = use_huge_pages()             # before the rank's first large allocation; logged
    moved = huge_page_weights(model)     # bytes moved; 0 where it does not apply
    huge_page_tensors(weights.values())  # the same for loose tensors (artifacts/load.py)

Why: a CPU decode step reads every weight once per step, so it runs at the speed the weights
stream from the caches or from memory. With 4 KiB pages the 25 MB of the bench checkpoint's
weights span 6,400 pages, far more than the TLB holds; scattered over them they compete for
the L3's sets unevenly, and once a neighbour (the HTTP process, a client) evicts part of them
the prefetchers stop at every page edge. docs/performance.md has the measured gains.

**The allocator's hint.** torch's CPU allocator asks the kernel for huge pages
(``madvise(MADV_HUGEPAGE)``) on every allocation of 2 MiB or more when ``THP_MEM_ALLOC_ENABLE``
is set; it reads that variable once, at the process's first such allocation. Every command
that runs a model (``generate``, ``serve``, ``eval``, ``compile``, ``bench``) turns it on in
each rank before loading anything, unless the environment sets it (``THP_MEM_ALLOC_ENABLE=0``
keeps it off). In the command's own process the variable is set for that first allocation
only and then restored, so the processes it starts (a bench's reference server) get the
environment their user gave; the ranks a command launches get it in their environment
(:func:`rank_env`). Where the system's mode is ``never`` nothing changes; where it is
``always`` the pages are huge already.

**The weights' move** (:func:`huge_page_weights`, :func:`huge_page_tensors`), for the tensors
under 2 MiB the hint leaves, and to lay the weights side by side: one anonymous private
mapping, 2 MiB aligned and advised ``MADV_HUGEPAGE``; each storage of the tensors is copied
into it (64-byte aligned) as a storage of its own over that part of the mapping, and every
tensor over it rebound (``.data``) to a view of the same size, strides and storage offset:
tied weights stay tied, column-major weights stay column-major (``weight_layout.py``). A
storage of its own, not views of one storage of the whole mapping: code that reads a tensor's
bytes from its storage's start plus an offset of its own (Inductor's C++ GEMM template
packing a constant weight did, with offset 0: it packed the mapping's first bytes, zeros)
reads the same bytes as before the move. The old storage goes as soon as nothing else holds
it, so the peak is the weights plus one storage. Before the step compiles: a compiled graph
that took a tensor as a constant would keep the old one. Only plain strided CPU tensors move
(DTensor parameters stay where they are; the paged KV pools, written every step and sized by
their own budget, are left by the runner), only where transparent huge pages are not
``never``.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "THP_ENV",
    "HugePages",
    "huge_kib",
    "huge_page_tensors",
    "huge_page_weights",
    "huge_pages_available",
    "rank_env",
    "system_thp_mode",
    "use_huge_pages",
    "wanted",
]

logger = logging.getLogger(__name__)

THP_ENV = "THP_MEM_ALLOC_ENABLE"
_SYSTEM_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
#: torch's threshold for the hint (``c10/core/impl/alloc_cpu.cpp``: ``gAlloc_threshold_thp``)
_THRESHOLD = 2 * 1024 * 1024
_PAGE = 2 << 20  # a transparent huge page on x86-64 and most arm64 kernels
_ALIGN = 64


@dataclass(frozen=True)
class HugePages:
    """What a rank asked for: ``wanted`` (the environment's word, else on), the system's THP
    mode (None where the system does not say) and ``granted``: whether a fresh 4 MiB tensor
    lay in huge pages (None where ``/proc/self/smaps`` cannot tell)."""

    wanted: bool
    system: str | None
    granted: bool | None = None

    def describe(self) -> str:
        if not self.wanted:
            return f"huge pages for large CPU tensors: off ({THP_ENV}=0)"
        if self.system == "never":
            return "huge pages for large CPU tensors: asked, but the system's THP mode is never"
        if self.granted is False:
            return (
                "huge pages for large CPU tensors: asked, not granted (this process allocated "
                "tensors before, or the system had no huge page free)"
            )
        return f"huge pages for large CPU tensors: on (system THP mode {self.system or 'unknown'})"


def wanted(environ: MutableMapping[str, str]) -> bool:
    """Whether the environment leaves huge pages on (unset, or set to anything but ``0`` or
    empty)."""
    value = environ.get(THP_ENV)
    return value is None or value.strip() not in ("", "0")


def rank_env(environ: MutableMapping[str, str]) -> dict[str, str]:
    """What a command's launched ranks get in their environment: the variable set, unless the
    environment says (a launched rank imports torch and makes tensors before its command
    starts, so it needs it from its first line)."""
    return {THP_ENV: "1"} if THP_ENV not in environ else {}


def system_thp_mode(path: str = _SYSTEM_MODE) -> str | None:
    """The kernel's THP mode (``always``, ``madvise`` or ``never``: the bracketed word), or
    None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


_state: HugePages | None = None


def use_huge_pages() -> HugePages:
    """Turn huge pages on for this process's large CPU tensors, unless the environment says
    otherwise (see the module); the environment is left as it was. Only a process's first
    call acts, and only before its first tensor: the allocator reads the variable at its first
    allocation (a process that made a tensor before keeps the allocator's choice). The CLI
    calls it first thing (before its parser imports the commands: one of them makes a tensor),
    and each rank again, which logs :meth:`HugePages.describe` (a launched rank is a new
    process)."""
    global _state
    if _state is None:
        want, mode = wanted(os.environ), system_thp_mode()
        if want and THP_ENV not in os.environ:
            os.environ[THP_ENV] = "1"
            try:  # the allocator reads the variable now and keeps its answer
                torch.empty(_THRESHOLD, dtype=torch.uint8)
            finally:
                del os.environ[THP_ENV]
        _state = HugePages(want, mode, _granted() if want and mode != "never" else None)
    return _state


def _granted() -> bool | None:
    """Whether a fresh 4 MiB tensor, touched, lies in huge pages; None where
    ``/proc/self/smaps`` cannot be read."""
    probe = torch.ones(2 * _THRESHOLD, dtype=torch.uint8)
    start = probe.data_ptr()
    kib = huge_kib(start, start + 1)
    return None if kib is None else kib > 0


def huge_kib(lo: int, hi: int, smaps: str = "/proc/self/smaps") -> int | None:
    """KiB of this process's anonymous huge pages (``AnonHugePages``) in the mappings that
    overlap the addresses [lo, hi); None where ``smaps`` cannot be read."""
    total, inside = 0, False
    try:
        with open(smaps, encoding="ascii", errors="replace") as f:
            for line in f:
                head = line.split(maxsplit=1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):  # a mapping's first line
                    start, end = (int(v, 16) for v in head.split("-"))
                    inside = start < hi and end > lo
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return total


def huge_pages_available(mode: str | None = None) -> bool:
    """Transparent huge pages can back an advised mapping here (Linux, the system's THP mode
    ``always`` or ``madvise``: ``mode``, default the system's)."""
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


def _tensors(model: nn.Module, skip: tuple[type[nn.Module], ...]) -> Iterator[torch.Tensor]:
    """The model's parameters and buffers (a tied weight more than once), but those of the
    modules of the ``skip`` types."""
    for module in model.modules():
        if not isinstance(module, skip):
            yield from module.parameters(recurse=False)
            yield from (b for b in module.buffers(recurse=False) if b is not None)


def huge_page_weights(model: nn.Module, *, skip: tuple[type[nn.Module], ...] = ()) -> int:
    """Move the storages of ``model``'s parameters and buffers (but those of the modules of
    the ``skip`` types) into huge pages (module docstring); returns the bytes moved (0: not
    available here, or nothing to move)."""
    return huge_page_tensors(_tensors(model, skip))


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
