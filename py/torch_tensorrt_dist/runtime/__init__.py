"""Runtime: launching ranks, setting up ``torch.distributed``, NCCL libraries, timeouts.

* :func:`init_distributed` - process group from torchrun, mpirun or a single process.
* :func:`launch` - start N ranks of a script, module or function (torchrun or mpirun).
* :func:`agree` / :func:`agreed` - every rank learns whether a step failed on any rank.
* :func:`plan_from_env` - the pure reading of launcher variables behind ``init_distributed``.
* :func:`end_now` / :func:`end_by_signal` - end a rank at once (its failure record left, in
  ``FAILURE_DIR_ENV``'s folder) or by a signal.
"""

from __future__ import annotations

from torch_tensorrt_dist.runtime._rank_entry import FAILURE_DIR_ENV, end_by_signal, end_now
from torch_tensorrt_dist.runtime.agree import agree, agreed
from torch_tensorrt_dist.runtime.distributed import DistInfo, init_distributed
from torch_tensorrt_dist.runtime.env import DistPlan, is_launched, mpi_world_size, plan_from_env
from torch_tensorrt_dist.runtime.launcher import LaunchResult, launch
from torch_tensorrt_dist.runtime.timeouts import (
    TIMEOUT_ENV,
    CollectiveTimeoutError,
    collective_timeouts_explained,
    resolve_timeout,
)

__all__ = [
    "FAILURE_DIR_ENV",
    "TIMEOUT_ENV",
    "CollectiveTimeoutError",
    "DistInfo",
    "DistPlan",
    "LaunchResult",
    "agree",
    "agreed",
    "collective_timeouts_explained",
    "end_by_signal",
    "end_now",
    "init_distributed",
    "is_launched",
    "launch",
    "mpi_world_size",
    "plan_from_env",
    "resolve_timeout",
]
