"""What native DistCollective takes, as tables, and its decision for one collective. Pure."""

from __future__ import annotations

import torch

from torch_tensorrt_dist.conversion.dtypes import dtype_name
from torch_tensorrt_dist.conversion.interface import CollectiveQuery, Decision
from torch_tensorrt_dist.conversion.rules import nccl_shape_checks

__all__ = ["NATIVE_DTYPES", "NATIVE_OPERATION", "NATIVE_REDUCE_OPERATION", "native_decision"]

#: typed op -> trt.CollectiveOperation member
NATIVE_OPERATION: dict[str, str] = {
    "all_reduce": "ALL_REDUCE",
    "all_gather": "ALL_GATHER",
    "reduce_scatter": "REDUCE_SCATTER",
    "all_to_all": "ALL_TO_ALL",
    "broadcast": "BROADCAST",
}
#: our reduce op name -> trt.ReduceOperation member
NATIVE_REDUCE_OPERATION: dict[str, str] = {
    "sum": "SUM",
    "product": "PROD",
    "max": "MAX",
    "min": "MIN",
    "avg": "AVG",
}
#: dtypes we hand to TensorRT's DistCollective layer (NCCL has a native type for each).
NATIVE_DTYPES: frozenset[torch.dtype] = frozenset(
    {torch.float32, torch.float16, torch.bfloat16, torch.int32}
)


def native_decision(query: CollectiveQuery) -> Decision:
    """The installed TensorRT's members, the dtype, the shared NCCL checks, and the one
    communicator the engine binds."""
    op, dtype, ranks, reduce_name = query.op, query.dtype, query.ranks, query.reduce_op
    dim0, comm_ranks, members = query.dim0, query.comm_ranks, query.native_members
    outs, ins = query.output_split_sizes, query.input_split_sizes
    n = len(ranks)
    if members is not None:
        wanted = [f"CollectiveOperation.{NATIVE_OPERATION[op]}"]
        if reduce_name is not None and reduce_name in NATIVE_REDUCE_OPERATION:
            wanted.append(f"ReduceOperation.{NATIVE_REDUCE_OPERATION[reduce_name]}")
        lacking = [m for m in wanted if m not in members]
        if lacking:
            since = " (ALL_TO_ALL arrives in TensorRT 11.0)" if "ALL_TO_ALL" in lacking[0] else ""
            return Decision(False, f"the installed TensorRT has no {lacking[0]}{since}")
    if dtype not in NATIVE_DTYPES:
        names = ", ".join(sorted(dtype_name(d) for d in NATIVE_DTYPES))
        return Decision(
            False, f"native DistCollective is used for {names} only, not {dtype_name(dtype)}"
        )
    refused = nccl_shape_checks(
        op, dtype, n, reduce_name, dim0, outs, ins, "TensorRT", NATIVE_REDUCE_OPERATION
    )
    if refused:
        return Decision(False, refused)
    if comm_ranks is not None and [int(r) for r in comm_ranks] != ranks:
        return Decision(
            False,
            f"the engine binds the NCCL communicator of ranks {list(comm_ranks)}, but this "
            f"collective runs on ranks {ranks}; routing another group through it is not "
            "verified, so it stays in PyTorch. Compile and run inside "
            "torch_tensorrt.distributed.distributed_context(<that group>) or use "
            "collective_impl='plugin'",
        )
    what = NATIVE_OPERATION[op]
    if reduce_name:
        what += f"/{NATIVE_REDUCE_OPERATION[reduce_name]}"
    return Decision(True, f"native DistCollective {what} over ranks {ranks}")
