"""The ``add_dist_collective`` arguments for one collective, computed without TensorRT.

Native (``INetworkDefinition.add_dist_collective(input, CollectiveOperation, ReduceOperation,
root, groups)`` then ``layer.num_ranks = n``): ``groups`` are ranks *within the communicator
the engine binds*; ``root`` is -1 for collectives without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from torch_tensorrt_dist.conversion.impl.native.rules import (
    NATIVE_OPERATION,
    NATIVE_REDUCE_OPERATION,
    native_decision,
)
from torch_tensorrt_dist.conversion.rules import decide
from torch_tensorrt_dist.conversion.table import COLLECTIVES
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

__all__ = ["NativeCollectiveSpec", "native_collective_spec"]


@dataclass(frozen=True)
class NativeCollectiveSpec:
    """The arguments of one ``add_dist_collective`` call and the layer's ``num_ranks``."""

    collective_operation: str  # trt.CollectiveOperation member name
    reduce_operation: str  # trt.ReduceOperation member name ("NONE" when it does not reduce)
    root: int  # rank within the communicator; -1 when the collective has no root
    groups: np.ndarray  # int64 ranks within the communicator
    num_ranks: int


def native_collective_spec(
    op: str,
    dtype: object,
    group_ranks: Sequence[int],
    reduce_op: str | None = None,
    root: int | None = None,
    *,
    comm_ranks: Sequence[int] | None = None,
    native_members: frozenset[str] | None = None,
) -> NativeCollectiveSpec:
    """The ``add_dist_collective`` arguments for ``op`` over the global ``group_ranks``.

    ``root`` is the broadcast source as a rank within the group (the typed op's ``src``).
    ``comm_ranks`` are the global ranks of the communicator the engine binds (default: the
    group itself, so ``groups`` is ``0..n-1``). Raises :class:`UnsupportedCollectiveError`
    where TensorRT cannot do it exactly.
    """
    ok, reason = decide(
        native_decision,
        op,
        dtype,
        group_ranks,
        reduce_op=reduce_op,
        src=root,
        comm_ranks=comm_ranks,
        native_members=native_members,
    )
    if not ok:
        raise UnsupportedCollectiveError(f"{op} cannot become a native TensorRT layer: {reason}")
    row = COLLECTIVES[op]
    if row.rooted and root is None:
        raise UnsupportedCollectiveError(f"{op} needs its root (the source rank within the group)")
    ranks = [int(r) for r in group_ranks]
    comm = ranks if comm_ranks is None else [int(r) for r in comm_ranks]
    if any(r not in comm for r in ranks):
        raise UnsupportedCollectiveError(
            f"{op} over ranks {ranks} cannot run on a communicator of ranks {comm}"
        )
    groups = np.asarray([comm.index(r) for r in ranks], dtype=np.int64)
    if row.reduces:
        from torch_tensorrt_dist.ops.collectives import normalize_reduce_op

        reduce_operation = NATIVE_REDUCE_OPERATION[normalize_reduce_op(reduce_op or "sum")]
    else:
        reduce_operation = "NONE"
    native_root = comm.index(ranks[root]) if row.rooted and root is not None else -1
    return NativeCollectiveSpec(
        collective_operation=NATIVE_OPERATION[op],
        reduce_operation=reduce_operation,
        root=native_root,
        groups=groups,
        num_ranks=len(ranks),
    )
