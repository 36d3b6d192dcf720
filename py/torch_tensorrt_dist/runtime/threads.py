"""How many intra-op threads a rank runs: its share of the cores it is given.

    n = threads_for(cores=16, local_ranks=2, flag=None, env=None)   # 8
    with use_threads(rank_thread_count(flag=None)):                 # set, logged, restored
        ...

Every command that runs a model (``generate``, ``serve``, ``eval``, ``compile``) sets it in
each rank before any model work: ``--threads N`` if given, else ``OMP_NUM_THREADS`` if set, else
the cores this process may run on (its CPU affinity, ``os.sched_getaffinity``) divided by the
ranks on this node (``LOCAL_WORLD_SIZE``, or Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``); never
below 1. ``serve`` in one process leaves one core to its HTTP process (``reserve=1``): on 2
cores, its rank's 2 threads left the HTTP process none between steps (the bench checkpoint,
quiet: 875 against 1,168 tok/s at 8 clients with one thread; beside another busy process 45
against 1,097), as vLLM runs its engine's torch ops on one thread. torch's own default is the
machine's core count whatever the affinity, so a
``serve --tp 1`` in a container limited to 4 of 64 cores would run 64 threads on 4 cores.
The inter-op pool is set to the same number where this process has not started it yet (torch
allows that once, before any parallel work).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping

import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.runtime.env import plan_from_env

__all__ = ["cores_given", "rank_thread_count", "threads_for", "use_threads"]

logger = logging.getLogger(__name__)

OMP_ENV = "OMP_NUM_THREADS"


def cores_given() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_for(
    cores: int, local_ranks: int, flag: int | None, env: str | None, *, reserve: int = 0
) -> int:
    """A rank's intra-op threads (pure): ``flag`` (``--threads``), else ``env``
    (``OMP_NUM_THREADS``; of a nested list such as ``4,2`` the first level), else
    ``(cores - reserve) // local_ranks``; never below 1. A malformed ``env`` is a ConfigError.
    ``reserve``: cores left to another process of the command (serve's HTTP process)."""
    if flag is not None:
        if flag < 1:
            raise ConfigError(f"--threads must be an integer >= 1, got {flag}")
        return flag
    if env is not None and env.strip():
        first = env.split(",")[0].strip()
        if not first.isdigit() or int(first) < 1:
            raise ConfigError(
                f"{OMP_ENV}={env!r} is not a thread count: set it to an integer >= 1, or unset "
                "it (each rank then takes its cores / the ranks on its node), or pass --threads"
            )
        return int(first)
    return max(1, (cores - reserve) // max(1, local_ranks))


_interop_set = False


def _set_interop(n: int) -> None:
    """The inter-op pool, once per process and only before it has started (torch refuses
    later: the pool it has stays)."""
    global _interop_set
    if _interop_set:
        return
    _interop_set = True
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError as exc:  # parallel work has started, or it was set before
        logger.debug("inter-op threads stay %d (%s)", torch.get_num_interop_threads(), exc)


def rank_thread_count(
    flag: int | None, environ: Mapping[str, str] | None = None, *, reserve: int = 0
) -> int:
    """This rank's intra-op threads (:func:`threads_for` of the cores it is given, less
    ``reserve``, and the ranks on its node, as its launcher's variables say)."""
    env = os.environ if environ is None else environ
    local = plan_from_env(env, rendezvous=False).local_world_size
    return threads_for(cores_given(), local, flag, env.get(OMP_ENV), reserve=reserve)


@contextlib.contextmanager
def use_threads(n: int) -> Iterator[int]:
    """Run the block with ``n`` intra-op threads (and the inter-op pool, where it can still be
    set); the previous intra-op number is back afterwards (commands run in process: tests)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    _set_interop(n)
    logger.info("%d intra-op threads (%d cores given)", n, cores_given())
    try:
        yield n
    finally:
        torch.set_num_threads(before)
