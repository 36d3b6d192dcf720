"""How a command that starts ranks (``generate``, ``compile``, ``run``, ``serve``) reports a
failure, in the launching process and in a rank.

A rank that our launcher started does not print its error: it leaves the error to its failure
record (``runtime/_rank_entry.py``) by exiting through ``SystemExit(code) from error``, and the
launcher prints the line of the rank that failed first. A rank started by another launcher
(plain ``torchrun`` or ``mpirun``), and the single process, print ``error: ...`` themselves.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from torch_tensorrt_dist.runtime._rank_entry import FAILURE_DIR_ENV

__all__ = ["print_launch_failure", "refuse", "reported_by_launcher", "world_size"]


def world_size() -> int:
    """The launched world's size, from torchrun's or Open MPI's variables (1 without a
    launcher): what a rank states when the world does not fit the command."""
    from torch_tensorrt_dist.runtime import plan_from_env

    return plan_from_env(os.environ).world_size


def reported_by_launcher() -> bool:
    """True in a rank whose failure ``torchtrt-dist``'s launcher reports."""
    from torch_tensorrt_dist.runtime import is_launched

    return bool(os.environ.get(FAILURE_DIR_ENV)) and is_launched(os.environ)


def refuse(exc: BaseException, code: int, prefix: str = "error") -> int:
    """Print ``prefix: exc`` and return ``code``; in a rank our launcher reports, exit with
    ``code`` instead, carrying ``exc`` to the launcher."""
    if reported_by_launcher():
        raise SystemExit(code) from exc
    print(f"{prefix}: {exc}", file=sys.stderr, flush=True)
    return code


def print_launch_failure(result: Any, *, verbose: int = 0, prefix: str = "error: ") -> None:
    """The launcher's report of a failed job: the failed rank's error, then the line that
    names it (the traceback is logged at ``-v``; say so when it is not shown)."""
    if result.ok or not result.message:
        return
    message = f"{prefix}{result.message}"
    if result.traceback and not verbose:
        message += " (-v shows its traceback)"
    print(message, file=sys.stderr, flush=True)
