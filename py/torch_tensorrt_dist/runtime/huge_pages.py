"""Transparent huge pages for torch's large CPU tensors in each rank of a command.

    state = use_huge_pages()     # before the rank's first large allocation; logged

torch's CPU allocator asks the kernel for huge pages (``madvise(MADV_HUGEPAGE)``) on every
allocation of 2 MiB or more when ``THP_MEM_ALLOC_ENABLE`` is set; it reads that variable once,
at the process's first such allocation. Every command that runs a model (``generate``,
``serve``, ``eval``, ``compile``, ``bench``) turns it on in each rank before loading anything,
unless the environment sets it (``THP_MEM_ALLOC_ENABLE=0`` keeps it off). In the command's own
process the variable is set for that first allocation only and then restored, so the
processes it starts (a bench's reference server) get the environment their user gave; the
ranks a command launches get it in their environment (:func:`rank_env`).

Why: a CPU decode step reads every weight once per step, and with 4 KiB pages the 25 MB of
the bench checkpoint's weights span 6,400 pages, far more than the TLB holds. On this AMD EPYC
(the system's THP mode ``madvise``) 48 prompts x 64 tokens through ``Generator`` at 32 rows made
1,246-1,266 tok/s with huge pages against 1,000-1,141 without; the serving figures are in
docs/performance.md. Where the system's mode is ``never`` nothing changes; where it is
``always`` the pages are huge already.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass

import torch

__all__ = [
    "THP_ENV",
    "HugePages",
    "huge_kib",
    "rank_env",
    "system_thp_mode",
    "use_huge_pages",
    "wanted",
]

THP_ENV = "THP_MEM_ALLOC_ENABLE"
_SYSTEM_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
#: torch's threshold for the hint (``c10/core/impl/alloc_cpu.cpp``: ``gAlloc_threshold_thp``)
_THRESHOLD = 2 * 1024 * 1024


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
