"""The rules every implementation shares, and the front of every decision. Pure.

:func:`decide` checks what no implementation can take (an unknown op, a bad group, a broadcast
source outside the group, something that is not a dtype, an unknown reduce op), answers a
group of one rank (the identity), and hands the rest to one implementation's rules as a
:class:`CollectiveQuery`. :func:`nccl_shape_checks` is what every NCCL-backed layer refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch

from torch_tensorrt_dist.conversion.dtypes import as_torch_dtype, dtype_name
from torch_tensorrt_dist.conversion.interface import CollectiveQuery, Decision
from torch_tensorrt_dist.conversion.table import COLLECTIVES
from torch_tensorrt_dist.errors import TensorRTDistError

__all__ = ["check_group", "decide", "nccl_shape_checks", "uniform_splits"]


def check_group(group_ranks: Sequence[int]) -> str | None:
    ranks = list(group_ranks)
    if not ranks:
        return "the group has no ranks"
    if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks):
        return f"group ranks must be non-negative ints, got {ranks}"
    if len(set(ranks)) != len(ranks):
        return f"group ranks {ranks} repeat a rank"
    return None


def uniform_splits(
    n: int, dim0: int | None, outs: Sequence[int] | None, ins: Sequence[int] | None
) -> str | None:
    for what, sizes in (("output", outs), ("input", ins)):
        if sizes and len(set(sizes)) != 1:
            return (
                f"all_to_all with uneven {what} split sizes {list(sizes)}: TensorRT's ALL_TO_ALL "
                "exchanges equal blocks only"
            )
        if sizes and len(sizes) != n:
            return f"all_to_all over {n} ranks got {len(sizes)} {what} split sizes"
    if dim0 is not None and dim0 % n:
        return f"all_to_all over {n} ranks needs dim 0 ({dim0}) divisible by {n}"
    return None


def decide(
    rule: Callable[[CollectiveQuery], Decision],
    op: str,
    dtype: object,
    group_ranks: Sequence[int],
    *,
    reduce_op: str | None = None,
    src: int | None = None,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    dim0: int | None = None,
    comm_ranks: Sequence[int] | None = None,
    native_members: frozenset[str] | None = None,
) -> Decision:
    """The shared checks, then ``rule`` (one implementation's rules) for a group of 2+ ranks.
    The arguments are :func:`capability.conversion_decision`'s."""
    row = COLLECTIVES.get(op)
    if row is None:
        return Decision(False, f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
    bad_group = check_group(group_ranks)
    if bad_group:
        return Decision(False, bad_group)
    ranks = [int(r) for r in group_ranks]
    n = len(ranks)
    if row.rooted and src is not None and not 0 <= src < n:
        return Decision(False, f"broadcast source {src} is not a rank of a group of {n}")
    try:
        torch_dtype = as_torch_dtype(dtype)
        reduce_name = None if reduce_op is None else _normalize_reduce(reduce_op)
    except TensorRTDistError as exc:
        return Decision(False, str(exc))
    if row.reduces and reduce_name is None:
        reduce_name = "sum"  # c10d's default
    if n == 1:
        return Decision(True, "a group of one rank: the identity, no collective layer")
    return rule(
        CollectiveQuery(
            op,
            torch_dtype,
            ranks,
            reduce_name,
            dim0,
            output_split_sizes,
            input_split_sizes,
            comm_ranks,
            native_members,
        )
    )


def _normalize_reduce(reduce_op: str) -> str:
    from torch_tensorrt_dist.ops.collectives import normalize_reduce_op

    return normalize_reduce_op(reduce_op)


def nccl_shape_checks(
    op: str,
    dtype: torch.dtype,
    n: int,
    reduce_name: str | None,
    dim0: int | None,
    outs: Sequence[int] | None,
    ins: Sequence[int] | None,
    who: str,
    reduce_ops: Collection[str],
) -> str | None:
    """Why an NCCL-backed layer cannot do this collective exactly, or None: a reduce op it lacks
    (``reduce_ops``: the ones it has), avg of integers, uneven all_to_all splits, an
    indivisible dim 0."""
    if reduce_name is not None and reduce_name not in reduce_ops:
        return f"{who} has no {reduce_name!r} reduce operation"
    if reduce_name == "avg" and not dtype.is_floating_point:
        return f"avg of {dtype_name(dtype)} would round; cast to a floating dtype first"
    if COLLECTIVES[op].splits:
        uneven = uniform_splits(n, dim0, outs, ins)
        if uneven:
            return uneven
    if op == "reduce_scatter" and dim0 is not None and dim0 % n:
        return f"reduce_scatter over {n} ranks needs dim 0 ({dim0}) divisible"
    return None
