"""How a command that starts ranks (``generate``, ``compile``, ``run``, ``serve``) reports a
failure, in the launching process and in a rank.

A rank that our launcher started does not print its error: it leaves the error to its failure
record (``runtime/_rank_entry.py``) by exiting through ``SystemExit(code) from error``, and the
launcher prints the line of the rank that failed first. A rank started by another launcher
(plain ``torchrun`` or ``mpirun``), and the single process, print ``error: ...`` themselves,
once per node for what every rank refuses alike (:func:`prints_refusal`).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from torch_tensorrt_dist.errors import ConfigError, TensorRTDistError, VerificationError
from torch_tensorrt_dist.runtime import FAILURE_DIR_ENV

if TYPE_CHECKING:
    from torch_tensorrt_dist.config.run import RunConfig
    from torch_tensorrt_dist.runtime.launcher import LaunchResult

__all__ = [
    "alike_on_every_rank",
    "check_world",
    "mark_alike",
    "print_launch_failure",
    "prints_refusal",
    "refuse",
    "reported_by_launcher",
    "world_size",
]


_E = TypeVar("_E", bound=BaseException)


def mark_alike(exc: _E) -> _E:
    """``exc``, marked as a refusal every rank of a node raises alike (``same_on_every_rank``):
    under another launcher only the node's lowest local rank prints it (:func:`prints_refusal`)."""
    exc.same_on_every_rank = True  # type: ignore[attr-defined]
    return exc


@contextmanager
def alike_on_every_rank() -> Iterator[None]:
    """Marks a ConfigError raised inside (:func:`mark_alike`): for checks that read only the
    options and the files they name, never the rank (a command's option checks)."""
    try:
        yield
    except ConfigError as exc:
        mark_alike(exc)
        raise


def world_size() -> int:
    """The launched world's size, from torchrun's or Open MPI's variables (1 without a
    launcher): what a rank states when the world does not fit the command."""
    from torch_tensorrt_dist.runtime import plan_from_env

    return plan_from_env(os.environ).world_size


@contextmanager
def exit_codes() -> Iterator[None]:
    """In a rank our launcher started: our errors become the rank's exit status (1: an engine
    found wrong by ``--verify``; 2: a refusal, here or, as RankFailedError, on another rank),
    chained, so the failure record keeps the error and the launcher prints its line."""
    try:
        yield
    except VerificationError as exc:
        raise SystemExit(1) from exc
    except TensorRTDistError as exc:
        raise SystemExit(2) from exc


def rank_entry(
    rank_main: Callable[[RunConfig], int], config: RunConfig, log_level: int = logging.WARNING
) -> None:
    """Entry of a rank our launcher started (``launch(rank_entry, n, [rank_main, config,
    log_level])``): ``rank_main(config)``, its errors and non-zero return as the rank's exit
    status. ``log_level``: the command's (``-v``: INFO, ``-vv``: DEBUG); a started process
    has no logging set up, and its lines name the rank."""
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(level=log_level, format=f"%(levelname)s rank {rank} %(name)s: %(message)s")
    with exit_codes():
        code = rank_main(config)
    if code:
        raise SystemExit(code)


def check_world(sizes: dict[str, int], *, note: str = "") -> int:
    """The launched world's size, when it is the product of ``sizes`` (``{"ep": 2, "tp": 2}``:
    the command's parallel flags); else a ConfigError naming both, before any rank joins."""
    world = world_size()
    need = math.prod(sizes.values())
    if world != need:
        flags = " x ".join(f"--{name} {size}" for name, size in sizes.items())
        names = "/".join(f"--{name}" for name in sizes)
        raise mark_alike(
            ConfigError(
                f"{flags} needs {need} ranks, but the launcher started {world}; "
                f"{note}start {need} or change {names}"
            )
        )
    return world


def reported_by_launcher() -> bool:
    """True in a rank whose failure ``torchtrt-dist``'s launcher reports."""
    from torch_tensorrt_dist.runtime import is_launched

    return bool(os.environ.get(FAILURE_DIR_ENV)) and is_launched(os.environ)


def prints_refusal(exc: BaseException, env: Mapping[str, str], *, joined: bool) -> bool:
    """Whether this process prints its refusal ``exc`` itself (pure; ``joined``: the process
    group is initialised). Under another launcher every rank runs the command: what every rank
    of a node refuses alike before joining the world (the options, the world's size and layout:
    errors marked by :func:`mark_alike`) only the node's lowest local rank prints; any other
    refusal before joining (a rank with no GPU of its own, a rendezvous that failed) is printed
    by every rank that raised it, as it may be its own. After joining, a step that failed
    on one rank fails on all (``runtime.agree``): the failed rank prints its own error, and the
    ranks that only repeat it (``failed_rank``) stay quiet where that rank is on their node."""
    from torch_tensorrt_dist.runtime import is_launched, plan_from_env

    if not is_launched(env):
        return True
    try:
        # only the ranks are read: a missing rendezvous address is refused (alike) elsewhere
        plan = plan_from_env(env, rendezvous=False)
    except TensorRTDistError:  # variables that do not fit: say it everywhere
        return True
    failed = getattr(exc, "failed_rank", None)
    if isinstance(failed, int) and failed != plan.rank:
        first_here = (
            plan.rank - plan.local_rank
        )  # torchrun and mpirun number a node's ranks in a row
        if first_here <= failed < first_here + plan.local_world_size:
            return False
        return plan.local_rank == 0
    return joined or plan.local_rank == 0 or not getattr(exc, "same_on_every_rank", False)


def _joined() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def refuse(exc: BaseException, code: int, prefix: str = "error") -> int:
    """Print ``prefix: exc`` (where :func:`prints_refusal` says so) and return ``code``; in a
    rank our launcher reports, exit with ``code`` instead, carrying ``exc`` to the launcher."""
    if reported_by_launcher():
        raise SystemExit(code) from exc
    if prints_refusal(exc, os.environ, joined=_joined()):
        print(f"{prefix}: {exc}", file=sys.stderr, flush=True)
    return code


def print_launch_failure(
    result: LaunchResult, *, verbose: int = 0, prefix: str = "error: "
) -> None:
    """The launcher's report of a failed job: the failed rank's error, then the line that
    names it (the traceback is logged at ``-v``; say so when it is not shown)."""
    if result.ok or not result.message:
        return
    message = f"{prefix}{result.message}"
    if result.traceback and not verbose:
        message += " (-v shows its traceback)"
    print(message, file=sys.stderr, flush=True)
