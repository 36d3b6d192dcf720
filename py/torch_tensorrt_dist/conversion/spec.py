"""What the TensorRT shell emits for one collective, computed without TensorRT.

The shell (``converters.py``) only turns these objects into ``trt.PluginField``s or an
``add_dist_collective`` call; every number in an engine's collective layers comes from here.

TensorRT-LLM plugins (``cpp/tensorrt_llm/plugins/ncclPlugin/``, creators registered by
``initTrtLlmPlugins`` as version "1" in namespace "tensorrt_llm"):

    AllGather, ReduceScatter: group INT32[] (MPI world ranks), type_id INT32
    AllReduce: group, type_id, strategy INT8 (NCCL = 0), config INT8, fusion_op INT8
               (NONE = 0), counter INT32, eps FLOAT32, affine INT8, bias INT8, scale INT8

Native (``INetworkDefinition.add_dist_collective(input, CollectiveOperation, ReduceOperation,
root, groups)`` then ``layer.num_ranks = n``): ``groups`` are ranks *within the communicator
the engine binds*; ``root`` is -1 for collectives without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from torch_tensorrt_dist.conversion.capability import conversion_decision
from torch_tensorrt_dist.conversion.dtypes import trt_data_type
from torch_tensorrt_dist.conversion.table import COLLECTIVES, NATIVE_REDUCE_OPERATION
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

__all__ = [
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "NativeCollectiveSpec",
    "PluginSpec",
    "native_collective_spec",
    "trtllm_plugin_spec",
]

PLUGIN_NAMESPACE = "tensorrt_llm"
PLUGIN_VERSION = "1"

#: AllReduceStrategyType::NCCL, AllReduceFusionOp::NONE (kernels/customAllReduceKernels.h)
_STRATEGY_NCCL = 0
_FUSION_NONE = 0
_EPS = 1e-6  # read only by the fused RMS-norm variants, which we never request


@dataclass(frozen=True)
class PluginSpec:
    """One TensorRT-LLM plugin layer: creator name/version/namespace and its fields."""

    name: str
    version: str
    namespace: str
    fields: dict[str, np.ndarray]


@dataclass(frozen=True)
class NativeCollectiveSpec:
    """The arguments of one ``add_dist_collective`` call and the layer's ``num_ranks``."""

    collective_operation: str  # trt.CollectiveOperation member name
    reduce_operation: str  # trt.ReduceOperation member name ("NONE" when it does not reduce)
    root: int  # rank within the communicator; -1 when the collective has no root
    groups: np.ndarray  # int64 ranks within the communicator
    num_ranks: int


def _refuse_unless(op: str, impl: str, decision: tuple[bool, str]) -> None:
    ok, reason = decision
    if not ok:
        raise UnsupportedCollectiveError(f"{op} cannot become a {impl} TensorRT layer: {reason}")


def trtllm_plugin_spec(
    op: str, dtype: object, group_ranks: Sequence[int], reduce_op: str | None = None
) -> PluginSpec:
    """The TensorRT-LLM plugin for ``op`` on ``dtype`` over the global ``group_ranks``
    (``reduce_op`` None means "sum", c10d's default).

    Raises :class:`UnsupportedCollectiveError` (with the reason) where the plugins cannot do
    it exactly: see :func:`conversion_decision` with ``impl="plugin"``.
    """
    row = COLLECTIVES.get(op)
    if row is not None and row.plugin_name is None:
        raise UnsupportedCollectiveError(
            f"TensorRT-LLM has no {op} plugin; use collective_impl='native' (TensorRT >= 10.16)"
        )
    decision = conversion_decision(op, dtype, group_ranks, impl="plugin", reduce_op=reduce_op)
    _refuse_unless(op, "plugin", decision)
    row = COLLECTIVES[op]
    assert row.plugin_name is not None  # checked above
    fields: dict[str, np.ndarray] = {
        "group": np.asarray([int(r) for r in group_ranks], dtype=np.int32),
        "type_id": np.asarray([trt_data_type(dtype)], dtype=np.int32),
    }
    if op == "all_reduce":
        fields.update(
            strategy=np.asarray([_STRATEGY_NCCL], dtype=np.int8),
            config=np.asarray([0], dtype=np.int8),
            fusion_op=np.asarray([_FUSION_NONE], dtype=np.int8),
            counter=np.asarray([0], dtype=np.int32),
            eps=np.asarray([_EPS], dtype=np.float32),
            affine=np.asarray([0], dtype=np.int8),
            bias=np.asarray([0], dtype=np.int8),
            scale=np.asarray([0], dtype=np.int8),
        )
    return PluginSpec(row.plugin_name, PLUGIN_VERSION, PLUGIN_NAMESPACE, fields)


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
    _refuse_unless(
        op,
        "native",
        conversion_decision(
            op,
            dtype,
            group_ranks,
            impl="native",
            reduce_op=reduce_op,
            src=root,
            comm_ranks=comm_ranks,
            native_members=native_members,
        ),
    )
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
        collective_operation=row.native_operation,
        reduce_operation=reduce_operation,
        root=native_root,
        groups=groups,
        num_ranks=len(ranks),
    )
