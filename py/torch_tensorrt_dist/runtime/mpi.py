"""The ``mpirun`` launch: a pure command builder, and a runner that names the failed rank.

    cmd = build_mpirun_command(MpiCommand(program=[python, "-u", "app.py"], nproc_per_node=2,
                                          forward=("MASTER_ADDR", "MASTER_PORT")))
    # ['mpirun', '-np', '2', '--bind-to', 'none', '-x', 'MASTER_ADDR', '-x', 'MASTER_PORT',
    #  python, '-u', 'app.py']

Every rank then sees ``OMPI_COMM_WORLD_*`` and the forwarded ``MASTER_ADDR``/``MASTER_PORT``,
which :func:`~torch_tensorrt_dist.runtime.init_distributed` reads. This is the launch the
TensorRT-LLM plugins need: they build their NCCL communicator over ``MPI_COMM_WORLD``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from torch_tensorrt_dist.errors import ConfigError, DistributedSetupError
from torch_tensorrt_dist.runtime.failures import (
    FailedRank,
    LaunchInterrupted,
    parse_mpirun_failure,
)

__all__ = [
    "FORWARDED_VARS",
    "BannerFilter",
    "MpiCommand",
    "build_mpirun_command",
    "find_mpirun",
    "first_host",
    "root_env",
    "run_mpirun",
]

logger = logging.getLogger(__name__)

#: Variables passed on to every rank (also on other nodes) when they are set.
FORWARDED_VARS: tuple[str, ...] = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "TORCH_TENSORRT_DIST_NCCL_LIBRARY",
    "TORCH_TENSORRT_DIST_TIMEOUT",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
)


@dataclass(frozen=True)
class MpiCommand:
    """What to start and where. ``program`` is the argv every rank runs."""

    program: Sequence[str]
    nproc_per_node: int
    nnodes: int = 1
    hostfile: str | None = None
    forward: Sequence[str] = ()
    as_root: bool = False
    oversubscribe: bool = False
    bind_to: str = "none"
    mpirun: str = "mpirun"
    extra_args: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.program:
            raise ConfigError("no program to run: give a script (or -m module) after the options")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ConfigError(
                f"--nproc-per-node ({self.nproc_per_node}) and --nnodes ({self.nnodes}) must "
                "be >= 1"
            )
        if self.nnodes > 1 and not self.hostfile:
            raise ConfigError(
                f"--nnodes {self.nnodes} with --launcher mpi needs --hostfile (one line per "
                "node: `<host> slots=<nproc-per-node>`); mpirun starts every node from here"
            )

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def build_mpirun_command(spec: MpiCommand) -> list[str]:
    """The ``mpirun`` argv for ``spec`` (pure)."""
    cmd = [spec.mpirun, "-np", str(spec.world_size)]
    if spec.as_root:
        cmd.append("--allow-run-as-root")
    if spec.oversubscribe:
        cmd.append("--oversubscribe")
    if spec.hostfile:
        cmd += ["--hostfile", spec.hostfile]
    if spec.nnodes > 1 or spec.hostfile:
        # nproc-per-node ranks on each node, so OMPI_COMM_WORLD_LOCAL_RANK indexes the GPUs.
        cmd += ["--map-by", f"ppr:{spec.nproc_per_node}:node"]
    cmd += ["--bind-to", spec.bind_to]
    for name in dict.fromkeys(spec.forward):  # ordered, without duplicates
        cmd += ["-x", name]
    cmd += list(spec.extra_args)
    cmd += list(spec.program)
    return cmd


def root_env(is_root: bool) -> dict[str, str]:
    """Open MPI refuses to run as root unless told; these variables (plus the flag) allow it."""
    if not is_root:
        return {}
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def first_host(hostfile_text: str) -> str | None:
    """The first host named in an Open MPI hostfile (rank 0 runs there with ppr mapping)."""
    for line in hostfile_text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            return entry.split()[0]
    return None


def find_mpirun(name: str = "mpirun") -> str:
    path = shutil.which(name)
    if path is None:
        raise DistributedSetupError(
            f"{name!r} not found on PATH: --launcher mpi needs Open MPI. Install it "
            "(Debian/Ubuntu: apt-get install -y openmpi-bin libopenmpi-dev) or use "
            "--launcher torchrun"
        )
    return path


_RULE = re.compile(r"^-{70,}\s*$")
#: Open MPI's own reports of a failed job; the launcher prints one line about it instead.
_FAILURE_BANNERS = ("Primary job", "mpirun detected", "mpirun noticed", "exited on signal")


class BannerFilter:
    """Drops Open MPI's failure banners (blocks between two rules of dashes that report a
    failed process) from the stream copied to stderr, keeping everything else in order (pure).

    A block that is not a failure banner, or grows past ``max_block`` lines (a program's own
    dashes), is passed through as it was.
    """

    def __init__(self, *, keep: bool = False, max_block: int = 40) -> None:
        self.keep, self.max_block = keep, max_block
        self._block: list[str] = []

    def feed(self, line: str) -> list[str]:
        """The lines to print now that ``line`` arrived."""
        if self.keep:
            return [line]
        if not self._block:
            if _RULE.match(line):
                self._block = [line]
                return []
            return [line]
        self._block.append(line)
        if _RULE.match(line):
            block, self._block = self._block, []
            text = "".join(block)
            if any(word in text for word in _FAILURE_BANNERS):
                return []
            return block
        if len(self._block) > self.max_block:
            return self.flush()
        return []

    def flush(self) -> list[str]:
        """What is still held (at the end of the stream)."""
        block, self._block = self._block, []
        return block


def _tee(stream: IO[bytes] | None, tail: collections.deque[str], keep: bool) -> None:
    if stream is None:  # not reached: the stream is a pipe
        return
    banners = BannerFilter(keep=keep)
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        sys.stderr.write("".join(banners.feed(line)))
        sys.stderr.flush()
        tail.append(line)
    sys.stderr.write("".join(banners.flush()))
    sys.stderr.flush()
    stream.close()


@contextlib.contextmanager
def _forward_termination(proc: subprocess.Popen[bytes]) -> Iterator[list[int]]:
    """While mpirun runs, pass SIGTERM/SIGHUP sent to us on to it (it stops every rank)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        proc.terminate()

    saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield received
    finally:
        for s, old in saved.items():
            signal.signal(s, old)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()  # mpirun forwards it to every rank
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_mpirun(cmd: Sequence[str], env: Mapping[str, str]) -> tuple[int, FailedRank | None]:
    """Run ``cmd``, copying mpirun's stderr through (without its failure banners, unless
    INFO logging is on: ``-v``); return its status and the rank mpirun names as failed.

    Raises :class:`LaunchInterrupted` when this process gets SIGINT, SIGTERM or SIGHUP (mpirun
    and the ranks are stopped first)."""
    logger.info("running: %s", " ".join(cmd))
    tail: collections.deque[str] = collections.deque(maxlen=400)
    proc = subprocess.Popen(list(cmd), env=dict(env), stderr=subprocess.PIPE)
    keep = logger.isEnabledFor(logging.INFO)  # -v shows mpirun's own failure report
    reader = threading.Thread(target=_tee, args=(proc.stderr, tail, keep), daemon=True)
    reader.start()
    with _forward_termination(proc) as received:
        try:
            returncode = proc.wait()
        except KeyboardInterrupt:
            _stop(proc)
            raise LaunchInterrupted(signal.SIGINT) from None
    reader.join(5)
    if received:
        raise LaunchInterrupted(received[0])
    failure = parse_mpirun_failure("".join(tail)) if returncode != 0 else None
    return returncode, failure
