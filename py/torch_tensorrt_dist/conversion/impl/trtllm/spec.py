"""The TensorRT-LLM plugin fields for one collective, computed without TensorRT.

The shell (``emitter.py``) only turns these objects into ``trt.PluginField``s; every number
in the plugin layers comes from here.

TensorRT-LLM plugins (``cpp/tensorrt_llm/plugins/ncclPlugin/``, creators registered by
``initTrtLlmPlugins`` as version "1" in namespace "tensorrt_llm"):

    AllGather, ReduceScatter: group INT32[] (MPI world ranks), type_id INT32
    AllReduce: group, type_id, strategy INT8 (NCCL = 0), config INT8, fusion_op INT8
               (NONE = 0), counter INT32, eps FLOAT32, affine INT8, bias INT8, scale INT8
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from torch_tensorrt_dist.conversion.dtypes import trt_data_type
from torch_tensorrt_dist.conversion.impl.trtllm.rules import PLUGIN_NAMES, plugin_decision
from torch_tensorrt_dist.conversion.interface import PluginSpec
from torch_tensorrt_dist.conversion.rules import decide
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

__all__ = ["PLUGIN_NAMESPACE", "PLUGIN_VERSION", "trtllm_plugin_spec"]

PLUGIN_NAMESPACE = "tensorrt_llm"
PLUGIN_VERSION = "1"

#: AllReduceStrategyType::NCCL, AllReduceFusionOp::NONE (kernels/customAllReduceKernels.h)
_STRATEGY_NCCL = 0
_FUSION_NONE = 0
_EPS = 1e-6  # read only by the fused RMS-norm variants, which we never request


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
    it exactly: see ``conversion_decision`` with ``impl="plugin"``.
    """
    plugin_name = PLUGIN_NAMES.get(op)
    if op in PLUGIN_NAMES and plugin_name is None:
        raise UnsupportedCollectiveError(
            f"TensorRT-LLM has no {op} plugin; use collective_impl='native' (TensorRT >= 10.16)"
        )
    decision = decide(plugin_decision, op, dtype, group_ranks, reduce_op=reduce_op)
    _refuse_unless(op, "plugin", decision)
    assert plugin_name is not None  # checked above
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
    return PluginSpec(plugin_name, PLUGIN_VERSION, PLUGIN_NAMESPACE, fields)
