"""Typed collective ops (``torch.ops.tensorrt_dist.*``), the grouped MoE experts op,
process-group resolution, and the CPU decode-attention op (``cpu_attention``, built at first
use)."""

from torch_tensorrt_dist.ops.collectives import (
    COLLECTIVE_OPS,
    REDUCE_OPS,
    normalize_reduce_op,
)
from torch_tensorrt_dist.ops.experts import EXPERTS_OP
from torch_tensorrt_dist.ops.groups import check_group_ranks, group_ranks, resolve_group

__all__ = [
    "COLLECTIVE_OPS",
    "EXPERTS_OP",
    "REDUCE_OPS",
    "check_group_ranks",
    "group_ranks",
    "normalize_reduce_op",
    "resolve_group",
]
