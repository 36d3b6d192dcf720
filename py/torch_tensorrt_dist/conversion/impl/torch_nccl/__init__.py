"""collective_impl="torch_nccl": our TensorRT plugins (``csrc/``, IPluginV3) running NCCL
collectives on the communicators torch.distributed already owns, any number of groups per
engine, under torchrun or mpirun.

    rules.py          TORCH_NCCL_DTYPES, REDUCE_OP_NUMBER; torch_nccl_decision
    spec.py           torch_nccl_plugin_spec: the plugin fields (pure)
    availability.py   torch_nccl_missing (loads the library)
    emitter.py        prepare_torch_nccl, torch_nccl_layer: add_plugin_v3 (TensorRT)
    library.py        find and load the plugin library (ctypes): its registry, its NCCL
    comms.py          register a ProcessGroupNCCL's communicator with the plugins
    build.py          header search and CMake commands of ``torchtrt-dist build-plugins``
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_tensorrt_dist.conversion.impl.torch_nccl.availability import torch_nccl_missing
from torch_tensorrt_dist.conversion.impl.torch_nccl.emitter import (
    prepare_torch_nccl,
    torch_nccl_layer,
)
from torch_tensorrt_dist.conversion.impl.torch_nccl.rules import torch_nccl_decision
from torch_tensorrt_dist.conversion.impl.torch_nccl.spec import torch_nccl_plugin_spec
from torch_tensorrt_dist.conversion.interface import CollectiveQuery, Decision, PluginSpec
from torch_tensorrt_dist.conversion.node_args import CollectiveCall

__all__ = ["TORCH_NCCL", "TorchNccl"]


class TorchNccl:
    """Our plugins: every op, every reduce op, seven dtypes, any group in any rank order."""

    name = "torch_nccl"
    label = "torch_nccl"
    description = "our plugins on torch's NCCL communicators"
    one_communicator_per_engine = False

    def auto_rank(self, *, one_group: bool) -> int:
        return 20  # after native where native takes the whole engine, else first

    def missing(self, plugin_path: str | None = None) -> str | None:
        return torch_nccl_missing()  # its own library, never the TensorRT-LLM plugin_path

    def facts(self, engine_ranks: Sequence[int] | None) -> dict[str, Any]:
        return {}

    def decide(self, query: CollectiveQuery) -> Decision:
        return torch_nccl_decision(query)

    def spec(self, call: CollectiveCall, dtype: torch.dtype, **facts: Any) -> PluginSpec:
        return torch_nccl_plugin_spec(
            call.op, dtype, call.group_ranks, call.reduce_op, call.src, dim0=call.dim0
        )

    def check_launch(self, groups: Sequence[Sequence[int]]) -> None:
        return None  # torchrun or mpirun: torch owns the communicators

    def install(self) -> None:
        return None

    def prepare(self, calls: Sequence[CollectiveCall], plugin_path: str | None) -> None:
        prepare_torch_nccl(calls)

    def emit(
        self, trt: Any, ctx: Any, x: Any, call: CollectiveCall, dtype: torch.dtype, name: str
    ) -> Any:
        return torch_nccl_layer(trt, ctx, x, call, dtype, name)


TORCH_NCCL = TorchNccl()
