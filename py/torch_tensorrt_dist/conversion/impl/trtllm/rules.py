"""What the TensorRT-LLM plugins take, as tables, and their decision for one collective. Pure."""

from __future__ import annotations

import torch

from torch_tensorrt_dist.conversion.dtypes import dtype_name
from torch_tensorrt_dist.conversion.interface import CollectiveQuery, Decision

__all__ = ["PLUGIN_DTYPES", "PLUGIN_NAMES", "plugin_decision"]

#: typed op -> TensorRT-LLM plugin creator name (version "1"); None: no such plugin
PLUGIN_NAMES: dict[str, str | None] = {
    "all_reduce": "AllReduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "all_to_all": None,
    "broadcast": None,
}
#: dtypes the TensorRT-LLM NCCL plugins reduce and move correctly in every release read: older
#: releases map only kFLOAT/kHALF/kBF16 to an NCCL type, and an unmapped type silently becomes
#: ncclInt8 (``std::unordered_map::operator[]``), so other dtypes are refused.
PLUGIN_DTYPES: frozenset[torch.dtype] = frozenset({torch.float32, torch.float16, torch.bfloat16})


def plugin_decision(query: CollectiveQuery) -> Decision:
    """A plugin for the op, the dtype, sum only, ascending ranks, an even reduce_scatter."""
    op, dtype, ranks, reduce_name, dim0 = (
        query.op,
        query.dtype,
        query.ranks,
        query.reduce_op,
        query.dim0,
    )
    plugin_name = PLUGIN_NAMES[op]
    n = len(ranks)
    if plugin_name is None:
        return Decision(
            False,
            f"TensorRT-LLM has no {op} plugin; use collective_impl='native' (TensorRT >= 10.16)",
        )
    if dtype not in PLUGIN_DTYPES:
        names = ", ".join(sorted(dtype_name(d) for d in PLUGIN_DTYPES))
        return Decision(
            False, f"the TensorRT-LLM plugins take {names} only, not {dtype_name(dtype)}"
        )
    if reduce_name is not None and reduce_name != "sum":
        return Decision(
            False, f"the TensorRT-LLM plugins reduce with sum only, not {reduce_name!r}"
        )
    if ranks != sorted(ranks):
        return Decision(
            False,
            f"group ranks {ranks} are not ascending: the plugins order NCCL ranks ascending, so "
            "gathered/scattered blocks would land in the wrong place",
        )
    if op == "reduce_scatter" and dim0 is not None and dim0 % n:
        return Decision(False, f"reduce_scatter over {n} ranks needs dim 0 ({dim0}) divisible")
    return Decision(True, f"TensorRT-LLM {plugin_name} plugin over MPI ranks {ranks}")
