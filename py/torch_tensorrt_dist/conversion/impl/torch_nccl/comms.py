"""Hand the NCCL communicators torch.distributed owns to our plugins (their registry).

    register_communicator(tp_group)      # collective over the group: all its ranks call it
    ...                                  # engines whose plugins use tp_group's ranks run
    unregister_communicator(tp_group)    # before dist.destroy_process_group(tp_group)

The registry (in the plugin library) maps a group's ordered global ranks to the ``ncclComm_t``
of its ``ProcessGroupNCCL`` (``_comm_ptr()``). torch creates a communicator lazily, so
registering first runs one small all_reduce on the group: the communicator then exists, and it
is the same one torch's own collectives on the group use. Entries are removed at interpreter
exit before torch destroys its groups (an ``atexit`` hook registered after the groups', so it
runs first); a program that destroys a group earlier unregisters it first.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from torch_tensorrt_dist.conversion.impl.torch_nccl.library import (
    TorchNcclPlugins,
    load_torch_nccl_plugins,
)
from torch_tensorrt_dist.errors import DistributedSetupError

__all__ = [
    "communicator_ptr",
    "register_communicator",
    "registered_communicators",
    "unregister_all",
    "unregister_communicator",
]

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_TRUE = ("1", "true", "yes", "on")
_registered: dict[tuple[int, ...], TorchNcclPlugins] = {}
_atexit_installed: list[bool] = []


def _nccl_backend(group: Any) -> Any:
    """The group's ``ProcessGroupNCCL``, or a :class:`DistributedSetupError` that says why not."""
    backend_name = dist.get_backend(group)
    if os.environ.get("TORCH_NCCL_USE_COMM_NONBLOCKING", "").strip().lower() in _TRUE:
        raise DistributedSetupError(
            "TORCH_NCCL_USE_COMM_NONBLOCKING is set: torch's NCCL communicators are then "
            "non-blocking, and our plugins treat NCCL's ncclInProgress as a failure; unset it "
            "for collective_impl='torch_nccl', or use collective_impl='native'"
        )
    try:
        backend = group._get_backend(torch.device("cuda"))
    except (RuntimeError, ValueError) as exc:
        raise DistributedSetupError(
            f"the process group of ranks {dist.get_process_group_ranks(group)} has no NCCL "
            f"backend (backend {backend_name!r}: {exc}); collective_impl='torch_nccl' needs "
            "groups made with backend='nccl' (init_process_group('nccl') / new_group)"
        ) from exc
    while not hasattr(backend, "_comm_ptr") and hasattr(backend, "wrapped_pg"):
        backend = backend.wrapped_pg  # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the backend
    if not hasattr(backend, "_comm_ptr"):
        raise DistributedSetupError(
            f"the process group of ranks {dist.get_process_group_ranks(group)} uses backend "
            f"{backend_name!r} ({type(backend).__name__}), which exposes no NCCL communicator "
            "(_comm_ptr); collective_impl='torch_nccl' runs on the communicator of torch's "
            "ProcessGroupNCCL, so create the group with backend='nccl' (not TORCH_DIST_USE_NCCL2)"
        )
    return backend


def communicator_ptr(group: Any, *, create: bool = True) -> int:
    """The ``ncclComm_t`` (as an int) of an NCCL group; ``create`` first runs one all_reduce
    on the group so that torch has created it (a collective call: every rank of the group)."""
    backend = _nccl_backend(group)
    if create:
        device = torch.device("cuda", torch.cuda.current_device())
        dist.all_reduce(torch.zeros(1, device=device), group=group)
        torch.cuda.synchronize(device)
    ptr = int(backend._comm_ptr())
    if not ptr:
        raise DistributedSetupError(
            f"the NCCL communicator of ranks {dist.get_process_group_ranks(group)} is not "
            "created yet; call register_communicator(group) (it creates it) on every rank"
        )
    return ptr


def register_communicator(
    group: Any, *, plugins: TorchNcclPlugins | None = None
) -> tuple[int, ...]:
    """Register ``group``'s NCCL communicator under its ordered global ranks; returns them.

    Collective: every rank of ``group`` calls it, in the same order for every group."""
    ranks = tuple(int(r) for r in dist.get_process_group_ranks(group))
    ptr = communicator_ptr(group)  # first: a group without NCCL is refused before anything else
    plugins = plugins or load_torch_nccl_plugins()
    with _lock:
        plugins.register(ranks, ptr)
        _registered[ranks] = plugins
        if not _atexit_installed:
            atexit.register(unregister_all)
            _atexit_installed.append(True)
    logger.debug("registered the NCCL communicator of ranks %s", list(ranks))
    return ranks


def unregister_communicator(group_or_ranks: Any) -> bool:
    """Remove a group's entry (a ProcessGroup or its ordered global ranks); False if none."""
    if isinstance(group_or_ranks, Sequence):
        ranks = tuple(int(r) for r in group_or_ranks)
    else:
        ranks = tuple(int(r) for r in dist.get_process_group_ranks(group_or_ranks))
    with _lock:
        plugins = _registered.pop(ranks, None)
    return plugins.unregister(ranks) if plugins is not None else False


def unregister_all() -> None:
    """Remove every entry this process registered (before torch destroys its groups)."""
    with _lock:
        entries = list(_registered.items())
        _registered.clear()
    for ranks, plugins in entries:
        plugins.unregister(ranks)


@contextlib.contextmanager
def registered_communicators(groups: Iterable[Any]) -> Iterator[list[tuple[int, ...]]]:
    """Register the groups for the block, unregister them after it."""
    done: list[tuple[int, ...]] = []
    try:
        for group in groups:
            done.append(register_communicator(group))
        yield done
    finally:
        for ranks in done:
            unregister_communicator(ranks)
