"""Read a typed collective's arguments from an FX node or a converter's ``args`` (pure).

After ``fuse_collectives`` every collective is a ``torch.ops.tensorrt_dist.*`` call with named
arguments; this module binds them by name (via the table), so no converter indexes ``args``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.conversion.table import COLLECTIVES, CollectiveRow
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

__all__ = ["CollectiveCall", "bind_collective", "collective_calls", "row_of"]


def _targets() -> dict[Any, CollectiveRow]:
    from torch_tensorrt_dist.ops.collectives import COLLECTIVE_OPS

    return {COLLECTIVE_OPS[name]: row for name, row in COLLECTIVES.items()}


def row_of(target: Any) -> CollectiveRow | None:
    """The table row of a typed collective op (OpOverload or packet), else None."""
    targets = _targets()
    if target in targets:
        return targets[target]
    default = getattr(target, "default", None)
    return targets.get(default) if default is not None else None


@dataclass(frozen=True)
class CollectiveCall:
    """One typed collective, its arguments bound by name."""

    op: str
    group_ranks: tuple[int, ...]
    group_name: str
    reduce_op: str | None = None
    src: int | None = None
    output_split_sizes: tuple[int, ...] = ()
    input_split_sizes: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    dim0: int | None = None
    #: a dynamic dim 0 (``dim0`` None): whether it splits evenly over the group for every value
    #: of its symbols (None where dim 0 is static or absent)
    dim0_divisible: bool | None = None


def bind_collective(
    row: CollectiveRow, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None
) -> CollectiveCall:
    """Bind ``args``/``kwargs`` of a typed op call (input first) to the row's argument names."""
    kwargs = dict(kwargs or {})
    names = ("x", *row.args)
    if len(args) > len(names):
        raise UnsupportedCollectiveError(f"{row.op} got {len(args)} arguments, expects {names}")
    bound = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names or key in bound:
            raise UnsupportedCollectiveError(f"{row.op} got an unexpected argument {key!r}")
        bound[key] = value
    missing = [n for n in names if n not in bound]
    if missing:
        raise UnsupportedCollectiveError(f"{row.op} call is missing {missing}")
    return CollectiveCall(
        op=row.op,
        group_ranks=tuple(int(r) for r in bound["group_ranks"]),
        group_name=str(bound["group_name"]),
        reduce_op=str(bound["reduce_op"]) if row.reduces else None,
        src=int(bound["src"]) if row.rooted else None,
        output_split_sizes=_sizes(row.op, bound.get("output_split_sizes")),
        input_split_sizes=_sizes(row.op, bound.get("input_split_sizes")),
        dtype=_input_dtype(bound["x"]),
        dim0=_input_dim0(bound["x"]),
        dim0_divisible=_dim0_divisible(bound["x"], len(bound["group_ranks"])),
    )


def _sizes(op: str, sizes: Any) -> tuple[int, ...]:
    """Split sizes as ints; a symbolic one (dynamic shapes) is refused, never specialised
    (``int()`` on it would add a guard that fixes the dimension)."""
    out = []
    for s in sizes or ():
        if isinstance(s, (torch.SymInt, fx.Node)):
            raise UnsupportedCollectiveError(
                f"{op} with dynamic split sizes ({s}): TensorRT's layers take static splits"
            )
        out.append(int(s))
    return tuple(out)


def _input_val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, fx.Node) else x


def _input_dtype(x: Any) -> torch.dtype | None:
    val = _input_val(x)
    return val.dtype if isinstance(val, torch.Tensor) else None


def _input_dim0(x: Any) -> int | None:
    val = _input_val(x)
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return None
    dim0 = val.shape[0]
    return dim0 if isinstance(dim0, int) else None  # a SymInt: not known at build time


def _dim0_divisible(x: Any, n: int) -> bool | None:
    """For a symbolic dim 0: divisible by ``n`` for every value of its symbols (no guard)."""
    val = _input_val(x)
    if not isinstance(val, torch.Tensor) or val.dim() == 0 or isinstance(val.shape[0], int):
        return None
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(val.shape[0] % n == 0)) if n > 0 else None


def collective_calls(gm: fx.GraphModule) -> list[CollectiveCall]:
    """Every typed collective of a lowered graph that TensorRT could take, in graph order (one
    whose arguments cannot be bound, dynamic split sizes say, stays in PyTorch: its validator
    refuses it, with the reason)."""
    out = []
    for node in gm.graph.nodes:
        row = row_of(node.target) if node.op == "call_function" else None
        if row is not None:
            try:
                out.append(bind_collective(row, node.args, node.kwargs))
            except UnsupportedCollectiveError:
                continue
    return out
