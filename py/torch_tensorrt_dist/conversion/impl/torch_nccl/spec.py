"""The fields of our collective plugins (``csrc/``, collective_impl="torch_nccl"). Pure.

Creators (``csrc/collective_plugin.cpp``), version "1", namespace "torch_tensorrt_dist", one
per op so each lists exactly the fields its op takes:

    TrtDistAllReduce, TrtDistReduceScatter: group INT32[], type_id INT32, reduce_op INT32
    TrtDistAllGather, TrtDistAllToAll:      group INT32[], type_id INT32
    TrtDistBroadcast:                       group INT32[], type_id INT32, root INT32

``group`` holds the group's global ranks in group order (the registry key of its
communicator), ``type_id`` the ``nvinfer1::DataType`` number, ``reduce_op`` NCCL's
``ncclRedOp_t`` number (sum 0, prod 1, max 2, min 3, avg 4), ``root`` the broadcast source as
a rank within the group.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from torch_tensorrt_dist.conversion.dtypes import trt_data_type
from torch_tensorrt_dist.conversion.impl.torch_nccl.rules import (
    REDUCE_OP_NUMBER,
    torch_nccl_decision,
)
from torch_tensorrt_dist.conversion.interface import PluginSpec
from torch_tensorrt_dist.conversion.rules import decide
from torch_tensorrt_dist.conversion.table import COLLECTIVES
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

__all__ = [
    "PLUGIN_NAMES",
    "REDUCE_OP_NUMBER",
    "TORCH_NCCL_NAMESPACE",
    "TORCH_NCCL_VERSION",
    "torch_nccl_plugin_spec",
]

TORCH_NCCL_NAMESPACE = "torch_tensorrt_dist"
TORCH_NCCL_VERSION = "1"
#: typed op -> creator name
PLUGIN_NAMES: dict[str, str] = {
    "all_reduce": "TrtDistAllReduce",
    "all_gather": "TrtDistAllGather",
    "reduce_scatter": "TrtDistReduceScatter",
    "all_to_all": "TrtDistAllToAll",
    "broadcast": "TrtDistBroadcast",
}


def _int32(*values: int) -> np.ndarray:
    return np.asarray([int(v) for v in values], dtype=np.int32)


def torch_nccl_plugin_spec(
    op: str,
    dtype: object,
    group_ranks: Sequence[int],
    reduce_op: str | None = None,
    root: int | None = None,
    *,
    dim0: int | None = None,
) -> PluginSpec:
    """Our plugin for ``op`` on ``dtype`` over the global ``group_ranks`` (in group order).

    ``reduce_op`` None means "sum" (c10d's default); ``root`` is the broadcast source as a rank
    within the group (required for broadcast). Raises :class:`UnsupportedCollectiveError` where
    the plugins cannot do it exactly (see ``conversion_decision`` with ``impl="torch_nccl"``).
    """
    ok, reason = decide(
        torch_nccl_decision, op, dtype, group_ranks, reduce_op=reduce_op, src=root, dim0=dim0
    )
    if not ok:
        raise UnsupportedCollectiveError(f"{op} cannot become a torch_nccl plugin: {reason}")
    row = COLLECTIVES[op]
    fields: dict[str, np.ndarray] = {
        "group": _int32(*group_ranks),
        "type_id": _int32(trt_data_type(dtype)),
    }
    if row.reduces:
        from torch_tensorrt_dist.ops.collectives import normalize_reduce_op

        fields["reduce_op"] = _int32(REDUCE_OP_NUMBER[normalize_reduce_op(reduce_op or "sum")])
    if row.rooted:
        if root is None:
            raise UnsupportedCollectiveError(
                f"{op} needs its root (the source rank within the group)"
            )
        fields["root"] = _int32(root)
    return PluginSpec(PLUGIN_NAMES[op], TORCH_NCCL_VERSION, TORCH_NCCL_NAMESPACE, fields)
