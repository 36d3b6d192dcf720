"""Run a function on N ranks in N fresh processes (``gloo`` on CPU), with a hard time limit.

    results = run_on_ranks(fn, 2, arg1, arg2, timeout=120)   # results[r] = fn(rank r, ...)

``fn`` must be importable (a module-level function): it runs in a spawned process after
``torch.distributed`` is initialised with ``RANK``/``WORLD_SIZE``/``MASTER_*`` set as torchrun
would set them. The first rank that fails (or the time limit) stops every rank; the error names
the rank and carries its traceback. A rank that dies without a Python exception (a signal, an
abort in native code such as glibc's heap checks) prints every thread's Python stack to its
stderr first (``faulthandler``), so the failure says where it was.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch_tensorrt_dist.runtime.ports import free_port

__all__ = ["RankFailure", "free_port", "run_on_ranks"]


class RankFailure(RuntimeError):
    """A rank raised, died or ran past the time limit."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    env: dict[str, str],
    args: tuple[Any, ...],
    conn: Any,
) -> None:
    faulthandler.enable(all_threads=True)
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend:
            dist.init_process_group(
                backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
            )
        try:
            result = fn(rank, world_size, *args)
        finally:
            if backend and dist.is_initialized():
                dist.destroy_process_group()
        conn.send(("ok", result))
    except BaseException as exc:  # report everything, including SystemExit
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 180.0,
    backend: str = "gloo",
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; return the results.

    ``backend=""`` skips ``init_process_group`` (for code that sets up distributed itself).
    Results must be picklable. Raises :class:`RankFailure` on the first failure or on timeout.
    """
    ctx = mp.get_context("spawn")
    port = free_port()
    procs, conns = [], []
    for rank in range(world_size):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, port, backend, timeout, dict(env or {}), args, child),
            daemon=True,
        )
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    results: list[Any] = [None] * world_size
    pending = set(range(world_size))
    deadline = time.monotonic() + timeout
    try:
        while pending:
            if time.monotonic() > deadline:
                raise RankFailure(
                    f"ranks {sorted(pending)} of {world_size} did not finish within {timeout:.0f} s"
                )
            for rank in sorted(pending):
                conn, proc = conns[rank], procs[rank]
                if conn.poll(0.05):
                    try:
                        status, payload = conn.recv()
                    except EOFError:
                        status, payload = "error", "exited without a result"
                    if status != "ok":
                        raise RankFailure(f"rank {rank} failed: {payload}", rank)
                    results[rank] = payload
                    pending.discard(rank)
                elif not proc.is_alive() and not conn.poll(0):
                    raise RankFailure(
                        f"rank {rank} died with exit code {proc.exitcode} and no result", rank
                    )
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
