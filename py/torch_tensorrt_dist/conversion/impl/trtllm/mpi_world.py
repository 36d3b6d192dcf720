"""Is this process in an MPI world the TensorRT-LLM plugins can build communicators in?

At engine run time each plugin's ``initialize()`` calls ``getComm(group)``: the lowest rank of
the group makes an NCCL unique id and sends it to the others over ``MPI_COMM_WORLD``. So the
plugins need an MPI launch (``mpirun -np N``, or ``torchtrt-dist run --launcher mpi``) in which
the MPI world rank of every process equals its torch.distributed global rank (the plugin
``group`` field holds torch global ranks). Under plain ``torchrun`` every worker is a world of
one and the exchange hangs or fails, so we refuse before building.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from torch_tensorrt_dist.errors import DistributedSetupError

__all__ = ["MpiWorld", "check_plugin_world", "mpi_world_from_env"]

_LAUNCH = (
    "launch with MPI (`torchtrt-dist run --launcher mpi --nproc-per-node N script.py`, or "
    "`mpirun -np N` with torch.distributed initialised from OMPI_COMM_WORLD_RANK / "
    "OMPI_COMM_WORLD_SIZE), or use collective_impl='native' (TensorRT >= 10.16), which works "
    "under torchrun"
)
#: (size variable, rank variable, launcher) in the order they are read
_ENV_WORLDS: tuple[tuple[str, str, str], ...] = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI"),
    ("PMI_SIZE", "PMI_RANK", "MPICH/Hydra"),
)


@dataclass(frozen=True)
class MpiWorld:
    size: int
    rank: int
    source: str


def mpi_world_from_env(env: Mapping[str, str] | None = None) -> MpiWorld | None:
    """The MPI world this process is in: mpi4py if it is initialised, else the launcher's
    environment (Open MPI, MPICH); None outside MPI. Never initialises MPI itself."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        comm = mpi.COMM_WORLD
        return MpiWorld(comm.Get_size(), comm.Get_rank(), "mpi4py")
    env = os.environ if env is None else env
    for size_var, rank_var, launcher in _ENV_WORLDS:
        if size_var in env and rank_var in env:
            try:
                return MpiWorld(int(env[size_var]), int(env[rank_var]), f"{launcher} environment")
            except ValueError as exc:
                raise DistributedSetupError(
                    f"{size_var}={env[size_var]!r} / {rank_var}={env[rank_var]!r} are not "
                    "integers; do not set them by hand, let mpirun set them"
                ) from exc
    return None


def _torch_world() -> tuple[int | None, int | None]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None, None


def check_plugin_world(
    group_ranks_list: Iterable[Sequence[int]],
    mpi_world_size: int | None = None,
    mpi_rank: int | None = None,
    *,
    torch_rank: int | None = None,
    torch_world_size: int | None = None,
    env: Mapping[str, str] | None = None,
) -> MpiWorld:
    """Refuse (``DistributedSetupError``) unless the plugins can make their communicators.

    ``group_ranks_list``: the global ranks of every group the engine's plugins use.
    ``mpi_world_size`` / ``mpi_rank`` default to :func:`mpi_world_from_env`; ``torch_rank`` /
    ``torch_world_size`` default to ``torch.distributed`` where it is initialised.
    """
    env = os.environ if env is None else env
    groups = [[int(r) for r in g] for g in group_ranks_list]
    if env.get("TLLM_DISABLE_MPI", "").strip().lower() in ("1", "on", "true", "yes"):
        raise DistributedSetupError(
            "TLLM_DISABLE_MPI is set, but the TensorRT-LLM plugins exchange their NCCL id over "
            "MPI; unset TLLM_DISABLE_MPI, or use collective_impl='native'"
        )
    if mpi_world_size is None or mpi_rank is None:
        world = mpi_world_from_env(env)
        if world is None:
            raise DistributedSetupError(
                f"the TensorRT-LLM plugins for groups {groups} build their NCCL communicators "
                "over MPI_COMM_WORLD, but this process was not started by MPI (no "
                f"OMPI_COMM_WORLD_SIZE / PMI_SIZE, no initialised mpi4py); {_LAUNCH}"
            )
    else:
        world = MpiWorld(int(mpi_world_size), int(mpi_rank), "given")
    if torch_rank is None and torch_world_size is None:
        torch_rank, torch_world_size = _torch_world()
    if torch_world_size is not None and torch_world_size != world.size:
        raise DistributedSetupError(
            f"torch.distributed has {torch_world_size} ranks but the MPI world ({world.source}) "
            f"has {world.size}: the plugin groups name MPI ranks, so both must be the same job; "
            f"{_LAUNCH}"
        )
    if torch_rank is not None and torch_rank != world.rank:
        raise DistributedSetupError(
            f"torch.distributed rank {torch_rank} is MPI rank {world.rank} ({world.source}): "
            "initialise torch.distributed with rank=OMPI_COMM_WORLD_RANK (the global rank, not "
            "OMPI_COMM_WORLD_LOCAL_RANK) so plugin groups name the same processes"
        )
    for group in groups:
        outside = [r for r in group if not 0 <= r < world.size]
        if outside:
            raise DistributedSetupError(
                f"group {group} names ranks {outside} outside the MPI world of {world.size} "
                f"({world.source}); {_LAUNCH}"
            )
    return world
