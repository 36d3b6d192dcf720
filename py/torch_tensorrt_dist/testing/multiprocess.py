"""Run a function on N ranks in N fresh processes (``gloo`` on CPU), with a hard time limit.

    results = run_on_ranks(fn, 2, arg1, arg2, timeout=120)   # results[r] = fn(rank r, ...)

``fn`` must be importable (a module-level function): it runs in a spawned process after
``torch.distributed`` is initialised with ``RANK``/``WORLD_SIZE``/``MASTER_*`` set as torchrun
would set them. The first rank that fails (or the time limit) stops every rank; the error names
the rank and carries its traceback. A rank that dies without a Python exception (a signal, an
abort in native code such as glibc's heap checks) prints every thread's Python stack to its
stderr first (``faulthandler``), so the failure says where it was.

Each rank is a fresh interpreter (``spawn``). :func:`use_forkserver` (the test suite's choice)
forks ranks instead from a server process that imported torch once: the same functions,
arguments, environment, working directory and stdout/stderr, seconds less per rank.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from torch_tensorrt_dist.runtime.ports import free_port

__all__ = ["RankFailure", "free_port", "run_on_ranks", "use_forkserver"]

#: how :func:`run_on_ranks` starts a rank: "spawn" or "forkserver" (:func:`use_forkserver`)
_START = {"method": "spawn"}


def use_forkserver(preload: Sequence[str] = ("torch", "torch.distributed")) -> None:
    """Start the ranks of later :func:`run_on_ranks` calls by forking a server process that
    imported ``preload`` once (started at the first call, it lives as long as this process),
    not a fresh interpreter each: an import of torch (seconds of CPU) less per rank. A rank
    still gets the caller's environment, working directory and stdout/stderr of its call;
    only the preloaded modules saw the environment of the server's start."""
    mp.get_context("forkserver").set_forkserver_preload(list(preload))
    _START["method"] = "forkserver"


class _Stdio:
    """The caller's stdout and stderr for a rank forked by the server (whose own are those of
    the first call): pickled as descriptors duplicated into the rank, as a Connection is."""

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return _stdio_fds, (reduction.DupFd(1), reduction.DupFd(2))


def _stdio_fds(out: Any, err: Any) -> tuple[int, int]:
    return out.detach(), err.detach()


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
    stdio: tuple[int, int] | None = None,
) -> None:
    if stdio is not None:  # forked by the server: the caller's streams and whole environment
        for fd, target in zip(stdio, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
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
            if backend and dist.is_initialized():
                _done(rank, world_size)
        finally:
            if backend and dist.is_initialized():
                dist.destroy_process_group()
        conn.send(("ok", result))
    except BaseException as exc:  # report everything, including SystemExit
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def _done(rank: int, world_size: int) -> None:
    """Count this rank done on the c10d store; rank 0, which hosts the store, waits for every
    rank (a rank whose groups finished first had ended the store under the others' schedule
    checks). The store alone, not a collective: a rank may return after a failed one."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    done = store.add("run_on_ranks/done", 1)
    while rank == 0 and done < world_size:  # the caller's time limit ends a rank that hangs
        time.sleep(0.01)
        done = store.add("run_on_ranks/done", 0)


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 180.0,
    backend: str = "gloo",
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; return the results.

    ``backend=""`` skips ``init_process_group`` (for code that sets up distributed itself).
    ``fresh``: spawn fresh interpreters even after :func:`use_forkserver` (a check of what a
    rank imports: the server's ranks hold its preloaded modules). Results must be picklable.
    Raises :class:`RankFailure` on the first failure or on timeout.
    """
    method = "spawn" if fresh else _START["method"]
    ctx: Any = mp.get_context(method)  # "spawn" or "forkserver"
    env = dict(env or {})
    stdio: _Stdio | None = None
    if method == "forkserver":  # what a spawned rank would inherit at this call
        env, stdio = {**os.environ, **env}, _Stdio()
    port = free_port()
    procs, conns = [], []
    for rank in range(world_size):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, port, backend, timeout, env, args, child, stdio),
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
