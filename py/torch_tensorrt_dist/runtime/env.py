"""Read how this process was launched from its environment (a pure function, no processes).

    plan = plan_from_env(os.environ)   # DistPlan(source="mpi", rank=1, world_size=2, ...)

Three launch styles are understood:

* ``torchrun`` / torchelastic: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``.
* Open MPI (``mpirun``): ``OMPI_COMM_WORLD_RANK`` (the global rank: never the local one),
  ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_SIZE``; the
  rendezvous address comes from ``MASTER_ADDR`` / ``MASTER_PORT``, which ``torchtrt-dist run
  --launcher mpi`` sets and forwards.
* a single process: none of the above; world size 1, no network needed.

Both sets present is allowed only when they agree (for example ``mpirun -x RANK=...``);
disagreement raises :class:`~torch_tensorrt_dist.errors.DistributedSetupError` naming the
variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from torch_tensorrt_dist.errors import DistributedSetupError

__all__ = [
    "MPI_VARS",
    "TORCHRUN_VARS",
    "DistPlan",
    "LaunchSource",
    "is_launched",
    "mpi_world_size",
    "plan_from_env",
]

LaunchSource = Literal["torchrun", "mpi", "single"]

#: torchrun name -> Open MPI name, for the four numbers both launchers provide.
_PAIRS: tuple[tuple[str, str], ...] = (
    ("RANK", "OMPI_COMM_WORLD_RANK"),
    ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
    ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
)
TORCHRUN_VARS: tuple[str, ...] = tuple(t for t, _ in _PAIRS)
MPI_VARS: tuple[str, ...] = tuple(m for _, m in _PAIRS)

_MPI_FIX = (
    "start it with `torchtrt-dist run --launcher mpi --nproc-per-node N script.py`, which sets "
    "them, or pass them to mpirun: `mpirun -x MASTER_ADDR=<rank-0 host> -x MASTER_PORT=29500 ...`"
)
_TORCHRUN_FIX = (
    "start it with `torchrun --nproc-per-node N script.py` (or `torchtrt-dist run`), which sets "
    "them, or export MASTER_ADDR=<rank-0 host> MASTER_PORT=<free port> on every rank"
)


@dataclass(frozen=True)
class DistPlan:
    """Where this process sits in the job, as its launcher described it."""

    source: LaunchSource
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def needs_rendezvous(self) -> bool:
        """True when other processes must be reached (world size above 1)."""
        return self.world_size > 1


def is_launched(env: Mapping[str, str]) -> bool:
    """True when a launcher (torchrun or mpirun) started this process as one of several ranks.

    A program that can start its own ranks (``generate``) calls this to avoid starting ranks
    from inside a rank.
    """
    return any(name in env for name in ("RANK", "WORLD_SIZE", *MPI_VARS[:2]))


def mpi_world_size(env: Mapping[str, str]) -> int | None:
    """Size of the MPI world this process belongs to, or None when no MPI launcher started it.

    Reads Open MPI's ``OMPI_COMM_WORLD_SIZE`` and, for MPICH / Intel MPI, ``PMI_SIZE``. The
    TensorRT-LLM plugins build their communicator over this world, so a plugin engine for a
    group of N ranks needs a world of at least N (the highest rank in the group + 1).
    """
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        value = _int(env, name)
        if value is not None:
            return value
    return None


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise DistributedSetupError(
            f"{name}={raw!r} is not an integer; the launcher sets it to a number: unset it or "
            "start the program through torchrun / mpirun"
        ) from None


def _read(env: Mapping[str, str], names: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for name in names:
        value = _int(env, name)
        if value is not None:
            out[name] = value
    return out


def _check_agreement(torch_vals: dict[str, int], mpi_vals: dict[str, int]) -> None:
    clashes = [
        f"{t}={torch_vals[t]} vs {m}={mpi_vals[m]}"
        for t, m in _PAIRS
        if t in torch_vals and m in mpi_vals and torch_vals[t] != mpi_vals[m]
    ]
    if clashes:
        raise DistributedSetupError(
            "conflicting launcher variables: "
            + "; ".join(clashes)
            + ". The process carries both torchrun and Open MPI variables and they disagree "
            "(for example torchrun started inside mpirun, or stale exports in the shell). "
            "Start it with one launcher, or unset the stale variables (`env -u RANK -u "
            "WORLD_SIZE ...` or `env -u OMPI_COMM_WORLD_RANK ...`)."
        )


def _master(
    env: Mapping[str, str], source: LaunchSource, world_size: int
) -> tuple[str | None, int | None]:
    addr = env.get("MASTER_ADDR") or None
    port = _int(env, "MASTER_PORT")
    if port is not None and not 0 < port < 65536:
        raise DistributedSetupError(f"MASTER_PORT={port} is not a TCP port (1..65535)")
    if world_size > 1 and (addr is None or port is None):
        missing = [n for n, v in (("MASTER_ADDR", addr), ("MASTER_PORT", port)) if v is None]
        fix = _MPI_FIX if source == "mpi" else _TORCHRUN_FIX
        raise DistributedSetupError(
            f"{' and '.join(missing)} not set, but {source} started this process as one of "
            f"{world_size} ranks and they must meet at a rendezvous address: {fix}"
        )
    return addr, port


def _validate(plan: DistPlan, names: tuple[str, ...]) -> DistPlan:
    rank_n, size_n, lrank_n, lsize_n = names
    if plan.world_size < 1:
        raise DistributedSetupError(f"{size_n}={plan.world_size}: the world size must be >= 1")
    if not 0 <= plan.rank < plan.world_size:
        raise DistributedSetupError(
            f"{rank_n}={plan.rank} is outside 0..{plan.world_size - 1} ({size_n}="
            f"{plan.world_size}); the launcher variables are inconsistent"
        )
    if not 1 <= plan.local_world_size <= plan.world_size:
        raise DistributedSetupError(
            f"{lsize_n}={plan.local_world_size} must be between 1 and {size_n}={plan.world_size}"
        )
    if not 0 <= plan.local_rank < plan.local_world_size:
        raise DistributedSetupError(
            f"{lrank_n}={plan.local_rank} is outside 0..{plan.local_world_size - 1} "
            f"({lsize_n}={plan.local_world_size})"
        )
    return plan


def plan_from_env(env: Mapping[str, str], *, rendezvous: bool = True) -> DistPlan:
    """Return the :class:`DistPlan` the environment ``env`` describes (pure: no side effects).

    Raises :class:`DistributedSetupError` when variables conflict, are partial or malformed,
    or (``rendezvous``) when several ranks have no ``MASTER_ADDR`` / ``MASTER_PORT`` to meet
    at; ``rendezvous=False`` reads the ranks only (the address is not needed yet).
    """
    torch_vals = _read(env, TORCHRUN_VARS)
    mpi_vals = _read(env, MPI_VARS)
    has_torch = "RANK" in torch_vals or "WORLD_SIZE" in torch_vals
    has_mpi = "OMPI_COMM_WORLD_RANK" in mpi_vals or "OMPI_COMM_WORLD_SIZE" in mpi_vals
    if has_torch and has_mpi:
        _check_agreement(torch_vals, mpi_vals)

    source: LaunchSource
    if has_mpi:
        source, vals, names = "mpi", mpi_vals, MPI_VARS
    elif has_torch:
        source, vals, names = "torchrun", torch_vals, TORCHRUN_VARS
    else:
        addr, port = _master(env, "single", 1)
        return DistPlan("single", 0, 1, 0, 1, addr, port)

    rank_n, size_n, lrank_n, lsize_n = names
    missing = [n for n in (rank_n, size_n) if n not in vals]
    if missing:
        present = rank_n if rank_n in vals else size_n
        raise DistributedSetupError(
            f"{present} is set but {missing[0]} is not: {source} sets both. Unset {present} for "
            f"a single process, or set {missing[0]} as well"
        )
    rank, world_size = vals[rank_n], vals[size_n]
    # Without a local size, assume one node: the local rank is the global rank.
    local_world_size = vals.get(lsize_n, world_size)
    local_rank = vals.get(
        lrank_n, rank if local_world_size == world_size else rank % local_world_size
    )
    plan = _validate(DistPlan(source, rank, world_size, local_rank, local_world_size), names)
    if not rendezvous:
        return plan
    addr, port = _master(env, source, world_size)
    return replace(plan, master_addr=addr, master_port=port)
