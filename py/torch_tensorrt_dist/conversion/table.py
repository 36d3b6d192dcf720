"""One row per typed collective: everything a converter needs to know about it.

Adding a collective is adding a row; the emitter (``converters.py``), the spec functions
(``spec.py``) and the capability decisions (``capability.py``) all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COLLECTIVES", "IMPLS", "NATIVE_REDUCE_OPERATION", "CollectiveRow"]

#: the TensorRT implementations of a collective layer: native DistCollective, TensorRT-LLM
#: plugins, and our own plugins (``csrc/``) on torch's NCCL communicator
IMPLS: tuple[str, ...] = ("native", "plugin", "torch_nccl")


@dataclass(frozen=True)
class CollectiveRow:
    op: str  # torch.ops.tensorrt_dist.<op>
    args: tuple[str, ...]  # schema argument names after the input tensor, in order
    native_operation: str  # trt.CollectiveOperation member
    plugin_name: str | None  # TensorRT-LLM plugin creator name (version "1"); None: none exists
    reduces: bool  # takes a reduce op
    rooted: bool  # takes a source / root rank
    splits: bool = False  # takes split sizes (all_to_all)


COLLECTIVES: dict[str, CollectiveRow] = {
    row.op: row
    for row in (
        CollectiveRow(
            "all_reduce",
            ("reduce_op", "group_name", "group_ranks"),
            "ALL_REDUCE",
            "AllReduce",
            reduces=True,
            rooted=False,
        ),
        CollectiveRow(
            "all_gather",
            ("group_name", "group_ranks"),
            "ALL_GATHER",
            "AllGather",
            reduces=False,
            rooted=False,
        ),
        CollectiveRow(
            "reduce_scatter",
            ("reduce_op", "group_name", "group_ranks"),
            "REDUCE_SCATTER",
            "ReduceScatter",
            reduces=True,
            rooted=False,
        ),
        CollectiveRow(
            "all_to_all",
            ("output_split_sizes", "input_split_sizes", "group_name", "group_ranks"),
            "ALL_TO_ALL",
            None,
            reduces=False,
            rooted=False,
            splits=True,
        ),
        CollectiveRow(
            "broadcast",
            ("src", "group_name", "group_ranks"),
            "BROADCAST",
            None,
            reduces=False,
            rooted=True,
        ),
    )
}

#: our reduce op name -> trt.ReduceOperation member
NATIVE_REDUCE_OPERATION: dict[str, str] = {
    "sum": "SUM",
    "product": "PROD",
    "max": "MAX",
    "min": "MIN",
    "avg": "AVG",
}
