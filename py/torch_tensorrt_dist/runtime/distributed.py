"""``init_distributed``: set up ``torch.distributed`` from whatever launched this process.

    info = init_distributed()            # torchrun, mpirun, or a single process
    info.rank, info.world_size, info.local_rank, info.device

* torchrun / torchelastic: ``env://`` rendezvous (reuses the agent's store).
* Open MPI: global rank from ``OMPI_COMM_WORLD_RANK``; rank 0 hosts a TCP store at
  ``MASTER_ADDR:MASTER_PORT``. ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` are
  exported (when absent) so code that reads them sees the same numbers.
* single process: an in-memory store, no network and no variables needed.

The backend is ``nccl`` when CUDA is available and ``gloo`` otherwise, unless given. With CUDA,
the process binds ``cuda:<local_rank>``. Calling it again returns the same information.

A gloo group that ``init_distributed`` created is destroyed when the interpreter exits (unless
the program destroyed it first): left to the C++ teardown at exit, gloo's worker threads can
abort the process (``terminate called without an active exception``) after all its work
succeeded, which a launcher then reports as a failed rank. Destroying a gloo group is local.
An NCCL group is not destroyed at exit: after a failure, destroying it could wait on peers that
are gone. Programs call ``dist.destroy_process_group()`` when they end normally, as torch asks.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_tensorrt_dist.errors import DistributedSetupError
from torch_tensorrt_dist.runtime.env import DistPlan, LaunchSource, plan_from_env
from torch_tensorrt_dist.runtime.nccl_env import find_nccl_library, load_nccl_library
from torch_tensorrt_dist.runtime.timeouts import (
    configured_timeout,
    note_configured_timeout,
    resolve_timeout,
)

__all__ = [
    "DistInfo",
    "bound_device",
    "configured_timeout",
    "default_backend",
    "init_distributed",
    "join_world",
]

logger = logging.getLogger(__name__)

_state: dict[str, DistInfo] = {}


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job once ``torch.distributed`` is up."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    launcher: LaunchSource
    device: str
    #: The collective timeout; None when another caller initialised torch.distributed.
    timeout: timedelta | None

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the rank that prints and saves)."""
        return self.rank == 0


def default_backend(cuda_available: bool) -> str:
    """``nccl`` with CUDA, ``gloo`` without."""
    return "nccl" if cuda_available else "gloo"


def _uses_nccl(backend: str) -> bool:
    return "nccl" in backend.lower()


def _bind_device(plan: DistPlan, backend: str) -> str:
    if not torch.cuda.is_available():
        if _uses_nccl(backend):
            raise DistributedSetupError(
                f"backend {backend!r} needs CUDA, but torch sees no GPU "
                f"(torch.cuda.is_available() is False); use backend='gloo' on CPU"
            )
        return "cpu"
    count = torch.cuda.device_count()
    if plan.local_rank >= count:
        raise DistributedSetupError(
            f"local rank {plan.local_rank} has no GPU: {count} visible on this node "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}). "
            f"Start at most {count} processes per node (--nproc-per-node {count})"
        )
    torch.cuda.set_device(plan.local_rank)
    return f"cuda:{plan.local_rank}"


def bound_device(backend: str, device: str) -> torch.device | None:
    """``device_id`` for ``init_process_group`` with NCCL: the group then creates its NCCL
    communicator now instead of at its first collective (and sub-groups made later inherit
    the device). TensorRT engines borrow that communicator; one that is never created would
    leave their collectives unbound."""
    if _uses_nccl(backend) and device.startswith("cuda"):
        return torch.device(device)
    return None


def _export_torch_vars(plan: DistPlan, environ: MutableMapping[str, str]) -> None:
    values = {
        "RANK": plan.rank,
        "WORLD_SIZE": plan.world_size,
        "LOCAL_RANK": plan.local_rank,
        "LOCAL_WORLD_SIZE": plan.local_world_size,
    }
    for name, value in values.items():
        environ.setdefault(name, str(value))


def _store(plan: DistPlan, timeout: timedelta) -> dist.Store:
    if not plan.needs_rendezvous:
        return dist.HashStore()
    if plan.master_addr is None or plan.master_port is None:  # plan_from_env guarantees both
        raise DistributedSetupError("MASTER_ADDR/MASTER_PORT missing for a multi-rank job")
    try:
        return dist.TCPStore(
            plan.master_addr,
            plan.master_port,
            plan.world_size,
            is_master=plan.rank == 0,
            timeout=timeout,
        )
    except (RuntimeError, OSError) as exc:
        where = f"{plan.master_addr}:{plan.master_port}"
        role = "host" if plan.rank == 0 else "reach"
        raise DistributedSetupError(
            f"rank {plan.rank} could not {role} the rendezvous store at {where}: {exc}. "
            "Check that MASTER_ADDR is rank 0's address as seen from every node and that "
            "MASTER_PORT is free there (pick another port) and not blocked by a firewall"
        ) from exc


def _destroy_at_exit(group: object) -> None:
    """Destroy the default group at exit if it is still the one ``init_distributed`` made."""
    try:
        if dist.is_initialized() and dist.group.WORLD is group:
            dist.destroy_process_group()
    except Exception as exc:  # exiting anyway: say why, never mask the exit status
        logger.warning("could not destroy the process group at exit: %s", exc)


def _info_from_current(plan: DistPlan, backend: str | None) -> DistInfo:
    current = str(dist.get_backend())
    if backend is not None and backend != current:
        raise DistributedSetupError(
            f"torch.distributed is already initialised with backend {current!r}; cannot switch "
            f"to {backend!r}. Call init_distributed() before any other init_process_group, "
            "or drop the backend argument"
        )
    rank, world_size = dist.get_rank(), dist.get_world_size()
    info = _state.get("info")
    if info is not None and (info.rank, info.world_size) == (rank, world_size):
        return info
    local_rank = plan.local_rank if plan.world_size == world_size else rank
    local_size = plan.local_world_size if plan.world_size == world_size else world_size
    device = f"cuda:{torch.cuda.current_device()}" if _uses_nccl(current) else "cpu"
    info = DistInfo(rank, world_size, local_rank, local_size, current, plan.source, device, None)
    _state["info"] = info
    note_configured_timeout(None)
    return info


def init_distributed(
    backend: str | None = None,
    timeout: timedelta | float | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> DistInfo:
    """Initialise ``torch.distributed`` for this process and return where it sits.

    Args:
        backend: ``"nccl"``, ``"gloo"`` or a device map such as ``"cpu:gloo,cuda:nccl"``;
            default ``nccl`` when CUDA is available, else ``gloo``.
        timeout: collective timeout (``timedelta`` or seconds); default
            ``$TORCH_TENSORRT_DIST_TIMEOUT`` or 10 minutes.
        env: the launcher variables to read (default ``os.environ``; for tests).

    Raises:
        DistributedSetupError: conflicting or missing launcher variables, no GPU for a local
            rank, an unreachable rendezvous, or a different backend already initialised.
        ConfigError: a malformed timeout.
    """
    environ = os.environ if env is None else env
    plan = plan_from_env(environ)
    if dist.is_initialized():
        return _info_from_current(plan, backend)
    if not dist.is_available():  # pragma: no cover - torch built without distributed
        raise DistributedSetupError("this torch build has no torch.distributed support")
    limit = resolve_timeout(timeout, environ)
    chosen = backend or default_backend(torch.cuda.is_available())
    device = _bind_device(plan, chosen)
    if _uses_nccl(chosen):
        library = find_nccl_library(environ)
        if library is not None:
            load_nccl_library(library)
    if plan.source == "mpi" and env is None:
        _export_torch_vars(plan, os.environ)

    bound = bound_device(chosen, device)
    if plan.needs_rendezvous and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # env:// joins torchelastic's agent store instead of binding MASTER_PORT again.
        dist.init_process_group(
            chosen,
            init_method="env://",
            rank=plan.rank,
            world_size=plan.world_size,
            timeout=limit,
            device_id=bound,
        )
    else:
        dist.init_process_group(
            chosen,
            store=_store(plan, limit),
            rank=plan.rank,
            world_size=plan.world_size,
            timeout=limit,
            device_id=bound,
        )
    if not _uses_nccl(chosen):
        atexit.register(_destroy_at_exit, dist.group.WORLD)
    info = DistInfo(
        plan.rank,
        plan.world_size,
        plan.local_rank,
        plan.local_world_size,
        str(dist.get_backend()),
        plan.source,
        device,
        limit,
    )
    _state["info"] = info
    note_configured_timeout(limit)
    logger.info(
        "rank %d/%d (local %d) up via %s, backend %s, device %s, timeout %.0f s",
        info.rank,
        info.world_size,
        info.local_rank,
        info.launcher,
        info.backend,
        info.device,
        limit.total_seconds(),
    )
    return info


def join_world(world_size: int) -> tuple[int, torch.device | str, dist.ProcessGroup | None]:
    """(rank, device, the world's group) of this process: :func:`init_distributed` when the
    world has other ranks, else rank 0 alone on this machine's device and no group."""
    if world_size == 1:
        return 0, "cuda" if torch.cuda.is_available() else "cpu", None
    info = init_distributed()
    return info.rank, info.device, dist.group.WORLD
