"""collective_impl="plugin": TensorRT-LLM's NCCL plugins (AllReduce, AllGather, ReduceScatter),
which make their own communicators over ``MPI_COMM_WORLD``: an MPI launch only.

    rules.py         PLUGIN_NAMES, PLUGIN_DTYPES; plugin_decision
    spec.py          trtllm_plugin_spec: the plugin fields (pure)
    availability.py  plugin_missing (loads the library)
    emitter.py       trtllm_layer: add_plugin_v2; IS_BUILDING=1 while TensorRT builds
    loader.py        find, check and load libnvinfer_plugin_tensorrt_llm.so (ctypes)
    elf.py           a library's DT_NEEDED entries (the TensorRT ABI check before loading)
    mpi_world.py     check_plugin_world: refuse outside a matching MPI world
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torch_tensorrt_dist.conversion.impl.trtllm.availability import plugin_missing
from torch_tensorrt_dist.conversion.impl.trtllm.emitter import (
    is_building_during_builds,
    trtllm_layer,
)
from torch_tensorrt_dist.conversion.impl.trtllm.loader import load_trtllm_plugins
from torch_tensorrt_dist.conversion.impl.trtllm.mpi_world import check_plugin_world
from torch_tensorrt_dist.conversion.impl.trtllm.rules import plugin_decision
from torch_tensorrt_dist.conversion.impl.trtllm.spec import trtllm_plugin_spec
from torch_tensorrt_dist.conversion.interface import CollectiveQuery, Decision, PluginSpec
from torch_tensorrt_dist.conversion.node_args import CollectiveCall

__all__ = ["TRTLLM", "TensorRTLLMPlugins"]


class TensorRTLLMPlugins:
    """The TensorRT-LLM plugins: three ops, sum only, fp32/fp16/bf16, ascending groups."""

    name = "plugin"
    label = "TensorRT-LLM plugins"
    description = "TensorRT-LLM plugins"
    one_communicator_per_engine = False

    def auto_rank(self, *, one_group: bool) -> int:
        return 40  # last: it needs an MPI launch and a library built for this TensorRT

    def missing(self, plugin_path: str | None = None) -> str | None:
        return plugin_missing(plugin_path)

    def facts(self, engine_ranks: Sequence[int] | None) -> dict[str, Any]:
        return {}

    def decide(self, query: CollectiveQuery) -> Decision:
        return plugin_decision(query)

    def spec(self, call: CollectiveCall, dtype: torch.dtype, **facts: Any) -> PluginSpec:
        return trtllm_plugin_spec(call.op, dtype, call.group_ranks, call.reduce_op)

    def check_launch(self, groups: Sequence[Sequence[int]]) -> None:
        check_plugin_world(groups)

    def install(self) -> None:
        is_building_during_builds()

    def prepare(self, calls: Sequence[CollectiveCall], plugin_path: str | None) -> None:
        load_trtllm_plugins(plugin_path)
        check_plugin_world([c.group_ranks for c in calls])

    def emit(
        self, trt: Any, ctx: Any, x: Any, call: CollectiveCall, dtype: torch.dtype, name: str
    ) -> Any:
        return trtllm_layer(trt, ctx, x, call, dtype, name)


TRTLLM = TensorRTLLMPlugins()
