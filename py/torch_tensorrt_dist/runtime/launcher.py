"""Start N ranks of a program with torchrun (torchelastic) or mpirun, and report failures.

    result = launch("app.py", 2, ["--flag"])                       # torchrun, this node
    result = launch("torch_tensorrt_dist", 2, ["generate", ...], module=True, launcher="mpi")
    result = launch(fn, 2, [arg])                                  # a function, torchrun only
    if not result.ok: print(result.message)                        # names the failed rank

Both modes give every rank the NCCL library environment (:mod:`.nccl_env`) and, when
``timeout`` is given, ``TORCH_TENSORRT_DIST_TIMEOUT``. Every rank runs through
:mod:`._rank_entry`, which records a failure (its error in one line, traceback, time) in a
folder made for the launch, and tells the launcher's :mod:`.exit_watch` when it ends. When a
rank fails, the others are stopped (torchelastic within its 0.1 s monitor interval, mpirun when
it sees the exit) and the result names the rank that failed first
(:func:`.failures.pick_first_failure`) with its own error and exit status.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from torch_tensorrt_dist.errors import ConfigError, DistributedSetupError
from torch_tensorrt_dist.runtime import _rank_entry
from torch_tensorrt_dist.runtime.exit_watch import ExitWatch
from torch_tensorrt_dist.runtime.failures import (
    FailedRank,
    LaunchInterrupted,
    cause_record,
    exit_status,
    format_failure,
    pick_first_failure,
    read_failure_records,
)
from torch_tensorrt_dist.runtime.mpi import (
    FORWARDED_VARS,
    MpiCommand,
    build_mpirun_command,
    find_mpirun,
    first_host,
    root_env,
    run_mpirun,
)
from torch_tensorrt_dist.runtime.nccl_env import find_nccl_library, nccl_env_additions
from torch_tensorrt_dist.runtime.ports import free_port
from torch_tensorrt_dist.runtime.threads import cores_given
from torch_tensorrt_dist.runtime.timeouts import TIMEOUT_ENV, resolve_timeout
from torch_tensorrt_dist.runtime.torchrun_agent import (
    caller_signal_handlers,
    quiet_agent,
    torchrun_env,
)

__all__ = ["LaunchOptions", "LaunchResult", "build_torchrun_argv", "free_port", "launch"]

logger = logging.getLogger(__name__)

Launcher = Literal["torchrun", "mpi"]
_ENTRY = os.path.abspath(_rank_entry.__file__)


@dataclass(frozen=True)
class LaunchOptions:
    """Where and how to start the ranks (the ``torchtrt-dist run`` options)."""

    nproc_per_node: int
    launcher: Launcher = "torchrun"
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str | None = None
    hostfile: str | None = None
    bind_to: str = "none"
    nccl_preload: bool = False
    timeout: timedelta | float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: seconds the ranks get to end after a signal to the launcher before they are killed
    #: (torchrun: ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, 30 by default); a server sets it from
    #: its drain timeout
    stop_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.launcher not in ("torchrun", "mpi"):
            raise ConfigError(f"launcher {self.launcher!r}: choose 'torchrun' or 'mpi'")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ConfigError(
                f"nproc_per_node={self.nproc_per_node}, nnodes={self.nnodes}: both must be >= 1"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"node_rank={self.node_rank} must be in 0..{self.nnodes - 1}")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


@dataclass(frozen=True)
class LaunchResult:
    """How the job ended. ``returncode`` is 0 on success, else the status of the rank that
    failed first; ``message`` then holds that rank's own error (one line, when it left one)
    and the line naming it."""

    returncode: int
    failure: FailedRank | None = None
    message: str | None = None
    elapsed_s: float = 0.0
    #: Return values by global rank (function entries under torchrun only).
    values: dict[int, Any] = field(default_factory=dict)
    #: The failed rank's traceback when it died of an unexpected exception, not a refusal of
    #: this package (every failed rank's traceback is logged at INFO: ``-v``).
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def build_torchrun_argv(
    opts: LaunchOptions, program: Sequence[str], *, run_id: str | None = None
) -> list[str]:
    """Arguments for ``torch.distributed.run``'s parser (pure). ``program`` is the script (or
    our rank trampoline) followed by its arguments; it runs under ``python -u``."""
    argv = ["--nproc-per-node", str(opts.nproc_per_node), "--nnodes", str(opts.nnodes)]
    endpoint = opts.rdzv_endpoint
    if opts.rdzv_backend is not None:
        backend = opts.rdzv_backend
    elif opts.nnodes == 1 and endpoint is None and not opts.master_port:
        backend, endpoint = "c10d", "localhost:0"  # what --standalone does: a free local port
    else:
        backend = "c10d" if endpoint else "static"
    argv += ["--rdzv-backend", backend]
    if endpoint:
        argv += ["--rdzv-endpoint", endpoint]
    if backend == "static":
        argv += ["--node-rank", str(opts.node_rank)]
        if opts.master_addr:
            argv += ["--master-addr", opts.master_addr]
        if opts.master_port:
            argv += ["--master-port", str(opts.master_port)]
    argv += ["--rdzv-id", run_id or "torchtrt-dist", "--max-restarts", "0"]
    return [*argv, *program]


@contextlib.contextmanager
def _environ(updates: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(updates)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _rank_env(opts: LaunchOptions, failure_dir: str) -> dict[str, str]:
    base = {**os.environ, **opts.env}
    extra = nccl_env_additions(base, find_nccl_library(base), preload=opts.nccl_preload)
    if opts.timeout is not None:
        extra[TIMEOUT_ENV] = f"{resolve_timeout(opts.timeout, {}).total_seconds():g}"
    extra[_rank_entry.FAILURE_DIR_ENV] = failure_dir
    return {**opts.env, **extra}


def _program(entry: str, args: Sequence[str], module: bool) -> list[str]:
    return [_ENTRY, *(["--module"] if module else []), entry, *map(str, args)]


def _run_torchrun(
    opts: LaunchOptions,
    entry: str | Callable[..., Any],
    args: Sequence[Any],
    module: bool,
    env: Mapping[str, str],
) -> tuple[int, dict[int, FailedRank], dict[int, Any]]:
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    # One node: a fresh id. Several: every node must pass the same id to meet.
    run_id = f"torchtrt-{uuid.uuid4().hex[:8]}" if opts.nnodes == 1 else "torchtrt-dist"
    if callable(entry):
        argv = build_torchrun_argv(opts, ["<function>"], run_id=run_id)
    else:
        argv = build_torchrun_argv(opts, _program(entry, args, module), run_id=run_id)
    parsed = torchrun.get_args_parser().parse_args(argv)
    if parsed.master_port is None:
        parsed.master_port = 29500  # as torchrun does; only the static rendezvous reads it
    env = {**env, **torchrun_env(opts.nproc_per_node, {**os.environ, **env}, cores=cores_given())}
    with _environ(env), quiet_agent():
        config, cmd, cmd_args = torchrun.config_from_args(parsed)
        if opts.stop_timeout is not None:
            config.shutdown_timeout = math.ceil(opts.stop_timeout)
        # a function runs under _rank_entry.run_function, which records its failure
        target: Callable[..., Any] | str = _rank_entry.run_function if callable(entry) else cmd
        call_args = [entry, *args] if callable(entry) else cmd_args
        try:
            values = elastic_launch(config, target)(*call_args)
        except (DistNetworkError, DistStoreError, RendezvousError) as exc:
            raise DistributedSetupError(rendezvous_problem(opts, exc)) from None
        except ChildFailedError as exc:
            host = socket.gethostname()
            failed = {
                rank: FailedRank(
                    rank,
                    exit_code=pf.exitcode if pf.exitcode >= 0 else None,
                    signal=-pf.exitcode if pf.exitcode < 0 else None,
                    host=host,
                    pid=pf.pid,
                )
                for rank, pf in exc.failures.items()
            }
            _, first = exc.get_first_failure()
            code = first.exitcode if first.exitcode > 0 else 128 - first.exitcode
            return code or 1, failed, {}
        except SignalException as exc:  # the agent already stopped the workers
            raise LaunchInterrupted(int(exc.sigval)) from None
    return 0, {}, dict(values or {})


def rendezvous_problem(opts: LaunchOptions, exc: BaseException) -> str:
    """One line for a torchrun rendezvous that could not start (pure): a busy port names the
    option to change."""
    if opts.rdzv_endpoint:
        where, option = opts.rdzv_endpoint, "the port of --rdzv-endpoint"
    else:
        where = f"{opts.master_addr or '127.0.0.1'}:{opts.master_port or 29500}"
        option = "--master-port"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return (
            f"the rendezvous port {where} is already in use (another job or a process still "
            f"holding it); choose another {option}, or leave it unset on one node for a free "
            "port"
        )
    return (
        f"the rendezvous at {where} failed ({type(exc).__name__}: {text}); check that the "
        "address is this node's or reachable from it and that the port is free"
    )


def _mpi_env_and_command(
    opts: LaunchOptions, program: Sequence[str], env: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    if opts.node_rank != 0:
        raise ConfigError(
            "--node-rank has no meaning with --launcher mpi: mpirun starts every node listed in "
            "--hostfile from one command. Run it once, on one node"
        )
    addr, port = opts.master_addr, opts.master_port
    if addr is None:
        if opts.hostfile:
            with open(opts.hostfile) as fh:
                addr = first_host(fh.read())
        addr = addr or "127.0.0.1"
    if port is None:
        port = free_port() if opts.nnodes == 1 else 29500
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    full = {**os.environ, **env, "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    full.update(root_env(is_root))
    forward = [n for n in FORWARDED_VARS if n in full]
    forward += [n for n in (*env, _rank_entry.FAILURE_DIR_ENV) if n in full]
    spec = MpiCommand(
        program=[sys.executable, "-u", *program],
        nproc_per_node=opts.nproc_per_node,
        nnodes=opts.nnodes,
        hostfile=opts.hostfile,
        forward=forward,
        as_root=is_root,
        # One node without a hostfile: allow more ranks than Open MPI counts cores (CPU tests).
        oversubscribe=opts.hostfile is None and opts.world_size > (os.cpu_count() or 1),
        bind_to=opts.bind_to,
        mpirun=find_mpirun(),
    )
    return full, build_mpirun_command(spec)


def launch(
    entry: str | Callable[..., Any],
    nproc: int | LaunchOptions,
    args: Sequence[Any] = (),
    *,
    launcher: Launcher = "torchrun",
    module: bool = False,
    **options: Any,
) -> LaunchResult:
    """Run ``entry`` on ``nproc`` ranks per node and wait for them.

    Args:
        entry: a script path, a module name (``module=True``), or (torchrun only) a picklable
            module-level function called as ``entry(*args)`` in each rank.
        nproc: ranks per node, or a full :class:`LaunchOptions`.
        args: the program's arguments.
        launcher: ``"torchrun"`` (native DistCollective path) or ``"mpi"`` (TensorRT-LLM
            plugin path: ranks form an MPI world).
        options: the other :class:`LaunchOptions` fields (``nnodes``, ``master_addr``,
            ``hostfile``, ``timeout``, ``env``...).

    Returns a :class:`LaunchResult`; on failure its ``message`` gives the error of the rank that
    failed first (one line, when it left one) and a line naming that rank and how it ended, and
    ``returncode`` is that rank's exit status.
    """
    opts = (
        nproc
        if isinstance(nproc, LaunchOptions)
        else LaunchOptions(nproc_per_node=nproc, launcher=launcher, **options)
    )
    if callable(entry) and opts.launcher == "mpi":
        raise ConfigError("launcher='mpi' runs programs, not functions: pass a script or module")
    with caller_signal_handlers():
        return _launch(opts, entry, args, module)


def _launch(
    opts: LaunchOptions, entry: str | Callable[..., Any], args: Sequence[Any], module: bool
) -> LaunchResult:
    failure_dir = tempfile.mkdtemp(prefix="torchtrt-dist-")
    start = time.monotonic()
    try:
        env = _rank_env(opts, failure_dir)
        values: dict[int, Any] = {}
        with ExitWatch(failure_dir) as watch:
            if opts.launcher == "torchrun":
                code, failed, values = _run_torchrun(opts, entry, args, module, env)
            else:
                full, cmd = _mpi_env_and_command(opts, _program(str(entry), args, module), env)
                code, parsed = run_mpirun(cmd, full)
                failed = {} if parsed is None or parsed.rank is None else {parsed.rank: parsed}
        records = read_failure_records(failure_dir)
        first = pick_first_failure(failed, records, watch.events()) if code else None
    except LaunchInterrupted as exc:
        name = signal.Signals(exc.signum).name
        message = f"torchtrt-dist run ({opts.launcher}): stopped by {name}; the ranks were stopped."
        return LaunchResult(128 + exc.signum, None, message, time.monotonic() - start)
    finally:
        shutil.rmtree(failure_dir, ignore_errors=True)
    elapsed = time.monotonic() - start
    if code == 0:
        return LaunchResult(0, elapsed_s=elapsed, values=values)
    message = format_failure(opts.launcher, first, opts.world_size)
    cause = cause_record(first, records)
    trace = cause.get("traceback") if cause else None
    _log_failure(first, records, trace)
    logger.debug("launch failed after %.1f s", elapsed)
    crash = trace if cause is not None and not cause.get("refusal") else None
    return LaunchResult(exit_status(first, code), first, message, elapsed, traceback=crash)


def _log_failure(
    first: FailedRank | None, records: Mapping[int, Mapping[str, Any]], trace: str | None
) -> None:
    """At INFO (``-v``): the failed rank's traceback, and what the other ranks recorded."""
    if trace:
        logger.info(
            "rank %s failed first; its traceback:\n%s", first.rank if first else "?", trace.rstrip()
        )
    for rank in sorted(records):
        if first is not None and rank == first.rank:
            continue
        rec = records[rank]
        how = f" (repeating rank {rec['follows']})" if rec.get("follows") is not None else ""
        logger.info("rank %d also failed%s: %s", rank, how, rec.get("error") or "no message")
