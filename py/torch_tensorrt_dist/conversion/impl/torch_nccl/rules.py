"""What our plugins (``csrc/``) take, as tables, and their decision for one collective. Pure."""

from __future__ import annotations

import torch

from torch_tensorrt_dist.conversion.dtypes import dtype_name
from torch_tensorrt_dist.conversion.interface import CollectiveQuery, Decision
from torch_tensorrt_dist.conversion.rules import nccl_shape_checks

__all__ = ["REDUCE_OP_NUMBER", "TORCH_NCCL_DTYPES", "torch_nccl_decision"]

#: our reduce op name -> ncclRedOp_t number (the reduce ops the plugins have)
REDUCE_OP_NUMBER: dict[str, int] = {"sum": 0, "product": 1, "max": 2, "min": 3, "avg": 4}
#: dtypes our plugins (``csrc/``, collective_impl="torch_nccl") carry: each has an NCCL type
#: (fp8 e4m3 needs NCCL >= 2.24, checked when the plugin runs). Not uint8 (nor bool): TensorRT
#: does not support either as a plugin output type (NvInferRuntime.h, getOutputDataTypes).
TORCH_NCCL_DTYPES: frozenset[torch.dtype] = frozenset(
    {
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.float8_e4m3fn,
    }
)


def torch_nccl_decision(query: CollectiveQuery) -> Decision:
    """The dtype and the shared NCCL checks: any group, in any rank order."""
    op, dtype, ranks, reduce_name, dim0 = (
        query.op,
        query.dtype,
        query.ranks,
        query.reduce_op,
        query.dim0,
    )
    outs, ins = query.output_split_sizes, query.input_split_sizes
    n = len(ranks)
    if dtype not in TORCH_NCCL_DTYPES:
        names = ", ".join(sorted(dtype_name(d) for d in TORCH_NCCL_DTYPES))
        return Decision(
            False, f"our torch_nccl plugins carry {names} only, not {dtype_name(dtype)}"
        )
    refused = nccl_shape_checks(
        op, dtype, n, reduce_name, dim0, outs, ins, "NCCL", REDUCE_OP_NUMBER
    )
    if refused:
        return Decision(False, refused.replace("TensorRT's ALL_TO_ALL", "the plugin"))
    what = f"{op}/{reduce_name}" if reduce_name else op
    return Decision(True, f"torch_nccl plugin {what} on the NCCL communicator of ranks {ranks}")
