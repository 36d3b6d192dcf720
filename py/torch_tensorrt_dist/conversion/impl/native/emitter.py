"""The TensorRT shell of collective_impl="native": one ``add_dist_collective`` layer.

Every argument comes from ``spec.native_collective_spec`` (pure, tested). Not run against a
real TensorRT here (no TensorRT on this machine): the ``tensorrt``/``gpu`` tests exercise it.
"""

from __future__ import annotations

from typing import Any

from torch_tensorrt_dist.conversion.engine_binding import bound_communicator_ranks
from torch_tensorrt_dist.conversion.impl.native.availability import native_members
from torch_tensorrt_dist.conversion.impl.native.spec import native_collective_spec
from torch_tensorrt_dist.conversion.node_args import CollectiveCall
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

__all__ = ["native_layer"]


def _native_layer(trt: Any, ctx: Any, x: Any, spec: Any, name: str) -> Any:
    layer = ctx.net.add_dist_collective(
        x,
        getattr(trt.CollectiveOperation, spec.collective_operation),
        getattr(trt.ReduceOperation, spec.reduce_operation),
        spec.root,
        spec.groups,
    )
    if layer is None:
        raise UnsupportedCollectiveError(f"TensorRT refused the DistCollective layer {name}")
    layer.num_ranks = spec.num_ranks
    return layer


def native_layer(trt: Any, ctx: Any, x: Any, call: CollectiveCall, dtype: Any, name: str) -> Any:
    """Add the DistCollective layer for ``call`` on the ITensor ``x``, against the communicator
    Torch-TensorRT binds to the engine."""
    spec = native_collective_spec(
        call.op,
        dtype,
        call.group_ranks,
        call.reduce_op,
        call.src,
        comm_ranks=bound_communicator_ranks(),
        native_members=native_members(),
    )
    return _native_layer(trt, ctx, x, spec, name)
