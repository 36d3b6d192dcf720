"""The typed collective ops, ``torch.ops.tensorrt_dist.*``.

One op per collective, with named arguments and the group's global ranks recorded at lowering
time, so that a converter never guesses from positions and never has to look a group up:

    all_reduce(x, reduce_op, group_name, group_ranks)                     # x: [N, ...] -> [N, ...]
    all_gather(x, group_name, group_ranks)                                # [N, ...] -> [G*N, ...]
    reduce_scatter(x, reduce_op, group_name, group_ranks)                 # [G*N, ...] -> [N, ...]
    all_to_all(x, output_split_sizes, input_split_sizes, group_name, group_ranks)
    broadcast(x, src, group_name, group_ranks)      # src is a rank *within* the group

The eager kernels run the real collective (through ``_c10d_functional``) on the op's own group,
checked against the recorded ranks; the fake kernels give exact output shapes. Gathers and
scatters work on dim 0, as c10d's and TensorRT's collectives do.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import UnsupportedCollectiveError
from torch_tensorrt_dist.ops.groups import check_group_ranks

__all__ = [
    "COLLECTIVE_OPS",
    "REDUCE_OPS",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "normalize_reduce_op",
    "reduce_scatter",
]

NAMESPACE = "tensorrt_dist"

#: Reduce ops c10d's functional collectives accept for floating tensors, by canonical name.
REDUCE_OPS: tuple[str, ...] = ("sum", "avg", "min", "max", "product")
_REDUCE_ALIASES = {"prod": "product", "mean": "avg"}

_c10d = torch.ops._c10d_functional


def normalize_reduce_op(reduce_op: object) -> str:
    """Canonical lower-case name of a reduce op (``"sum"``, ``ReduceOp.SUM``, ``"PROD"``...)."""
    name = str(reduce_op).rsplit(".", 1)[-1].lower()
    name = _REDUCE_ALIASES.get(name, name)
    if name not in REDUCE_OPS:
        raise UnsupportedCollectiveError(
            f"reduce op {reduce_op!r} is not supported; use one of {', '.join(REDUCE_OPS)}"
        )
    return name


def _check_dim0(x: Tensor, what: str, n: int) -> None:
    if x.dim() == 0:
        raise UnsupportedCollectiveError(
            f"{what} needs a tensor with at least one dim, got a scalar"
        )
    if n > 1 and x.shape[0] % n != 0:
        raise UnsupportedCollectiveError(
            f"{what} over {n} ranks needs dim 0 ({x.shape[0]}) divisible by {n}"
        )


def _fresh(out: Tensor, x: Tensor) -> Tensor:
    # custom ops must not return an alias of an input (a group of one may hand x back)
    return out.clone() if out.data_ptr() == x.data_ptr() and x.numel() else out


@torch.library.custom_op(f"{NAMESPACE}::all_reduce", mutates_args=())
def all_reduce(x: Tensor, reduce_op: str, group_name: str, group_ranks: list[int]) -> Tensor:
    check_group_ranks(group_name, group_ranks)
    x = x.contiguous()
    out = _c10d.wait_tensor(_c10d.all_reduce(x, normalize_reduce_op(reduce_op), group_name))
    return _fresh(out, x)


@all_reduce.register_fake
def _(x: Tensor, reduce_op: str, group_name: str, group_ranks: list[int]) -> Tensor:
    normalize_reduce_op(reduce_op)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{NAMESPACE}::all_gather", mutates_args=())
def all_gather(x: Tensor, group_name: str, group_ranks: list[int]) -> Tensor:
    check_group_ranks(group_name, group_ranks)
    x = x.contiguous()
    out = _c10d.wait_tensor(_c10d.all_gather_into_tensor(x, len(group_ranks), group_name))
    return _fresh(out, x)


@all_gather.register_fake
def _(x: Tensor, group_name: str, group_ranks: list[int]) -> Tensor:
    _check_dim0(x, "all_gather", 1)
    return x.new_empty((x.shape[0] * len(group_ranks), *x.shape[1:]))


@torch.library.custom_op(f"{NAMESPACE}::reduce_scatter", mutates_args=())
def reduce_scatter(x: Tensor, reduce_op: str, group_name: str, group_ranks: list[int]) -> Tensor:
    check_group_ranks(group_name, group_ranks)
    _check_dim0(x, "reduce_scatter", len(group_ranks))
    x = x.contiguous()
    out = _c10d.wait_tensor(
        _c10d.reduce_scatter_tensor(x, normalize_reduce_op(reduce_op), len(group_ranks), group_name)
    )
    return _fresh(out, x)


@reduce_scatter.register_fake
def _(x: Tensor, reduce_op: str, group_name: str, group_ranks: list[int]) -> Tensor:
    normalize_reduce_op(reduce_op)
    _check_dim0(x, "reduce_scatter", len(group_ranks))
    return x.new_empty((x.shape[0] // len(group_ranks), *x.shape[1:]))


def _split_sizes(x: Tensor, sizes: Sequence[int], n: int, what: str) -> list[int]:
    if len(sizes) == 0:
        _check_dim0(x, "all_to_all", n)
        return [x.shape[0] // n] * n
    if len(sizes) != n:
        raise UnsupportedCollectiveError(
            f"all_to_all over {n} ranks got {len(sizes)} {what} split sizes: {list(sizes)}"
        )
    return list(sizes)


@torch.library.custom_op(f"{NAMESPACE}::all_to_all", mutates_args=())
def all_to_all(
    x: Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group_name: str,
    group_ranks: list[int],
) -> Tensor:
    check_group_ranks(group_name, group_ranks)
    n = len(group_ranks)
    ins = _split_sizes(x, input_split_sizes, n, "input")
    outs = _split_sizes(x, output_split_sizes, n, "output")
    if sum(ins) != x.shape[0]:
        raise UnsupportedCollectiveError(
            f"all_to_all input split sizes {ins} do not add up to dim 0 ({x.shape[0]})"
        )
    x = x.contiguous()
    out = _c10d.wait_tensor(_c10d.all_to_all_single(x, outs, ins, group_name))
    return _fresh(out, x)


@all_to_all.register_fake
def _(
    x: Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group_name: str,
    group_ranks: list[int],
) -> Tensor:
    outs = _split_sizes(x, output_split_sizes, len(group_ranks), "output")
    return x.new_empty((sum(outs), *x.shape[1:]))


@torch.library.custom_op(f"{NAMESPACE}::broadcast", mutates_args=())
def broadcast(x: Tensor, src: int, group_name: str, group_ranks: list[int]) -> Tensor:
    check_group_ranks(group_name, group_ranks)
    x = x.contiguous()
    out = _c10d.wait_tensor(_c10d.broadcast(x, src, group_name))
    return _fresh(out, x)


@broadcast.register_fake
def _(x: Tensor, src: int, group_name: str, group_ranks: list[int]) -> Tensor:
    if not 0 <= src < len(group_ranks):
        raise UnsupportedCollectiveError(
            f"broadcast source {src} is not a rank of a group of {len(group_ranks)}"
        )
    return torch.empty_like(x, memory_format=torch.contiguous_format)


#: op name -> the OpOverload, for passes, converters and reports.
COLLECTIVE_OPS = {
    "all_reduce": torch.ops.tensorrt_dist.all_reduce.default,
    "all_gather": torch.ops.tensorrt_dist.all_gather.default,
    "reduce_scatter": torch.ops.tensorrt_dist.reduce_scatter.default,
    "all_to_all": torch.ops.tensorrt_dist.all_to_all.default,
    "broadcast": torch.ops.tensorrt_dist.broadcast.default,
}
