"""Which collectives become TensorRT layers, with which implementation, and why not. Pure.

A collective that a TensorRT implementation cannot do exactly (a reduce op the plugins do not
have, a dtype they do not take, uneven all_to_all splits, a group the engine's communicator
cannot route...) is *rejected*: the op stays in PyTorch (its eager kernel runs the real c10d
collective) and the reason is reported. Nothing is ever converted approximately.

    conversion_decision("all_reduce", torch.float16, [2, 3], impl="plugin", reduce_op="max")
    # Decision(convertible=False, reason="the TensorRT-LLM plugins reduce with sum only ...")

The shared checks are ``rules.decide``; each implementation's own rules are in
``impl/<folder>/rules.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import fx

from torch_tensorrt_dist.conversion.choice import REQUESTABLE_IMPLS, current_impl
from torch_tensorrt_dist.conversion.impl import implementation
from torch_tensorrt_dist.conversion.interface import CollectiveQuery, Decision
from torch_tensorrt_dist.conversion.node_args import bind_collective, row_of
from torch_tensorrt_dist.conversion.rules import decide
from torch_tensorrt_dist.errors import UnsupportedCollectiveError

__all__ = ["conversion_decision", "node_decision"]

#: collectives whose dim 0 must divide evenly over the group (TensorRT's layers and the plugins
#: split it in equal blocks); a dynamic dim 0 must do so for every value of its symbols
_EVEN_DIM0 = ("reduce_scatter", "all_to_all")


def conversion_decision(
    op: str,
    dtype: object,
    group_ranks: Sequence[int],
    *,
    impl: str,
    reduce_op: str | None = None,
    src: int | None = None,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    dim0: int | None = None,
    comm_ranks: Sequence[int] | None = None,
    native_members: frozenset[str] | None = None,
) -> Decision:
    """Would this collective become a TensorRT layer with ``impl``? ``(convertible, reason)``.

    ``impl`` is "native", "plugin" or "torch_nccl" (ask about one implementation), or "auto"
    (the one the converters would use in this process: settings/env var, then what is
    installed). ``src`` is the broadcast source as a rank within the group (None: not known,
    not checked); ``reduce_op`` None means "sum"; split sizes None or empty mean even splits.
    ``dim0`` is the input's dim 0 when known. ``comm_ranks`` are the global ranks of the NCCL
    communicator the engine binds for native layers (Torch-TensorRT binds one per engine);
    None means the op's own group. ``native_members`` are the ``CollectiveOperation.X`` /
    ``ReduceOperation.X`` members the installed TensorRT has (``native_members`` of
    ``impl/native/availability.py``; None: not checked), so a member a release lacks is
    refused by name, never by version.
    """

    def rule(query: CollectiveQuery) -> Decision:
        name = impl
        if name == "auto":
            choice = current_impl()
            if choice.impl is None:
                return Decision(False, choice.reason)
            name = choice.impl
        found = implementation(name)
        if found is None:
            return Decision(
                False, f"unknown collective implementation {impl!r}; use {REQUESTABLE_IMPLS}"
            )
        return found.decide(query)

    return decide(
        rule,
        op,
        dtype,
        group_ranks,
        reduce_op=reduce_op,
        src=src,
        output_split_sizes=output_split_sizes,
        input_split_sizes=input_split_sizes,
        dim0=dim0,
        comm_ranks=comm_ranks,
        native_members=native_members,
    )


def node_decision(
    node: fx.Node,
    impl: str,
    comm_ranks: Sequence[int] | None = None,
    native_members: frozenset[str] | None = None,
) -> Decision:
    """:func:`conversion_decision` for one FX node (what the capability validators call)."""
    row = row_of(node.target) if node.op == "call_function" else None
    if row is None:
        return Decision(False, f"{node.format_node()} is not a torch.ops.tensorrt_dist collective")
    try:
        call = bind_collective(row, node.args, node.kwargs)
    except UnsupportedCollectiveError as exc:
        return Decision(False, str(exc))
    if call.dtype is None:
        return Decision(False, f"{node.name}: the input has no recorded dtype (meta['val'])")
    if call.op in _EVEN_DIM0 and call.dim0_divisible is False and len(call.group_ranks) > 1:
        n = len(call.group_ranks)
        return Decision(
            False,
            f"{call.op} over {n} ranks of a dynamic dim 0 that is not divisible by {n} for "
            "every size it may take (TensorRT splits dim 0 in equal blocks)",
        )
    return conversion_decision(
        call.op,
        call.dtype,
        call.group_ranks,
        impl=impl,
        reduce_op=call.reduce_op,
        src=call.src,
        output_split_sizes=call.output_split_sizes,
        input_split_sizes=call.input_split_sizes,
        dim0=call.dim0,
        comm_ranks=comm_ranks,
        native_members=native_members,
    )
