"""Process-group resolution: the one place that turns a c10d group name into ranks.

Relies on two private torch names, both guarded by ``tests/test_torch_internals.py``:
``torch.distributed.distributed_c10d._resolve_process_group`` (group name -> ProcessGroup)
and the ``GroupName`` convention of ``_c10d_functional`` ops (a ``str``, or the ProcessGroup
itself when ``torch.compiler.config.compile_on_one_rank`` is set).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from torch_tensorrt_dist.errors import GroupResolutionError

__all__ = ["check_group_ranks", "group_name_of", "group_ranks", "resolve_group"]


def resolve_group(group: Any) -> dist.ProcessGroup:
    """Return the ProcessGroup a collective argument names (a group name or the group)."""
    if isinstance(group, dist.ProcessGroup):
        return group
    if not isinstance(group, str):
        raise GroupResolutionError(
            f"expected a process-group name (str) or a ProcessGroup, got {type(group).__name__}: "
            f"{group!r}"
        )
    if not dist.is_initialized():
        raise GroupResolutionError(
            f"collective on group {group!r}, but torch.distributed is not initialised in this "
            "process; call torch_tensorrt_dist.init_distributed() (or "
            "torch.distributed.init_process_group) before running or compiling the model"
        )
    try:
        return c10d._resolve_process_group(group)  # type: ignore[arg-type]
    except Exception as exc:  # torch raises ValueError/RuntimeError/KeyError by version
        raise GroupResolutionError(
            f"no process group named {group!r} in this process ({type(exc).__name__}: {exc}). "
            "A graph captured in one process cannot name groups of another: create the same "
            "device mesh / subgroups (in the same order) on every rank before running it"
        ) from exc


def group_ranks(group: Any) -> list[int]:
    """Global ranks of the group, in group-rank order."""
    return list(dist.get_process_group_ranks(resolve_group(group)))


def group_name_of(group: Any) -> str:
    return group if isinstance(group, str) else resolve_group(group).group_name


def check_group_ranks(group: Any, expected: list[int]) -> dist.ProcessGroup:
    """Resolve ``group`` and check that its ranks are ``expected`` (recorded at lowering)."""
    pg = resolve_group(group)
    actual = list(dist.get_process_group_ranks(pg))
    if actual != list(expected):
        raise GroupResolutionError(
            f"process group {group_name_of(group)!r} now has ranks {actual}, but the graph was "
            f"lowered for ranks {list(expected)}; create the process groups in the same order "
            "as when the graph was compiled, or recompile"
        )
    return pg
