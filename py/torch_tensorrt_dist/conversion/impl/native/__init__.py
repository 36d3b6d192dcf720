"""collective_impl="native": TensorRT's DistCollective layer (TensorRT >= 10.16) on the one NCCL
communicator Torch-TensorRT binds to the engine (torch's own, of the group the engine is
pinned to).

    rules.py         NATIVE_OPERATION, NATIVE_REDUCE_OPERATION, NATIVE_DTYPES; native_decision
    spec.py          native_collective_spec: the add_dist_collective arguments (pure)
    availability.py  native_missing, native_members (what the installed TensorRT has)
    emitter.py       native_layer: add_dist_collective (TensorRT)

The engine's communicator binding is the core's (``engine.py``, ``engine_binding.py``), for
every implementation with ``one_communicator_per_engine``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_tensorrt_dist.conversion.impl.native.availability import native_members, native_missing
from torch_tensorrt_dist.conversion.impl.native.emitter import native_layer
from torch_tensorrt_dist.conversion.impl.native.rules import native_decision
from torch_tensorrt_dist.conversion.impl.native.spec import (
    NativeCollectiveSpec,
    native_collective_spec,
)
from torch_tensorrt_dist.conversion.interface import CollectiveQuery, Decision
from torch_tensorrt_dist.conversion.node_args import CollectiveCall

__all__ = ["NATIVE", "Native"]


class Native:
    """TensorRT DistCollective: every op, no plugin library, torchrun or mpirun."""

    name = "native"
    label = "native DistCollective"
    description = "TensorRT DistCollective"
    one_communicator_per_engine = True

    def auto_rank(self, *, one_group: bool) -> int:
        return 10 if one_group else 30  # first where it takes the whole engine

    def missing(self, plugin_path: str | None = None) -> str | None:
        return native_missing()

    def facts(self, engine_ranks: Sequence[int] | None) -> dict[str, Any]:
        return {"comm_ranks": engine_ranks, "native_members": native_members()}

    def decide(self, query: CollectiveQuery) -> Decision:
        return native_decision(query)

    def spec(self, call: CollectiveCall, dtype: torch.dtype, **facts: Any) -> NativeCollectiveSpec:
        return native_collective_spec(
            call.op, dtype, call.group_ranks, call.reduce_op, call.src, **facts
        )

    def check_launch(self, groups: Sequence[Sequence[int]]) -> None:
        return None  # torchrun or mpirun: torch owns the communicator

    def install(self) -> None:
        return None

    def prepare(self, calls: Sequence[CollectiveCall], plugin_path: str | None) -> None:
        return None  # the core pins the engine's group and binds its communicator

    def emit(
        self, trt: Any, ctx: Any, x: Any, call: CollectiveCall, dtype: torch.dtype, name: str
    ) -> Any:
        return native_layer(trt, ctx, x, call, dtype, name)


NATIVE = Native()
