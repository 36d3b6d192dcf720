"""The collectives a call actually issued, from profiler events (pure: no profiler in here).

A compiled graph's collectives are known from the graph; what runs between graphs (a block
compiled on its own leaves the embedding's all-reduce to eager PyTorch) is not. ``explain``
profiles one call and hands the events here. Collectives nest (a ``_c10d_functional`` op calls
the ``c10d`` op, our typed ops call ``_c10d_functional``), so only the outermost collective
event of each nest counts; waits are not collectives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["EagerCollective", "ProfilerEvent", "is_collective", "outermost_collectives", "untyped"]

_NAMESPACES = ("c10d::", "_c10d_functional::", "tensorrt_dist::")

#: c10d and functional-collective op names -> the collective (as our typed ops name them)
_KINDS = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast",
    "broadcast": "broadcast",
}


#: ops whose first tensor argument is the output; the tensor a rank sends is the next one
_SENT_ARG = {"_allgather_base_": 1, "_reduce_scatter_base_": 1, "alltoall_base_": 1}


class ProfilerEvent(Protocol):
    """What we read of ``torch.autograd.profiler_util.FunctionEvent``."""

    name: str
    cpu_parent: Any
    input_shapes: Any


@dataclass(frozen=True)
class EagerCollective:
    """Collectives that ran outside the lowered graphs, grouped by op and input shape."""

    op: str  #: the dispatcher op, ``c10d::allreduce_``
    #: of the tensor it sends, where the profiler saw it (not for c10d's lists of tensors)
    shape: tuple[int, ...] | None
    count: int

    @property
    def kind(self) -> str:
        """``all_reduce``, ``all_gather``, ... (the op name where we do not know it)."""
        return _KINDS.get(self.op.split("::", 1)[-1], self.op)

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "kind": self.kind, "shape": self.shape, "count": self.count}


def is_collective(name: str) -> bool:
    """A collective op's event (``c10d::allreduce_``), not a wait or anything else."""
    if not name.startswith(_NAMESPACES):
        return False
    op = name.split("::", 1)[1]
    return "wait" not in op and op not in ("barrier", "monitored_barrier_")


def _nested_in_collective(event: ProfilerEvent) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if is_collective(parent.name):
            return True
        parent = parent.cpu_parent
    return False


def outermost_collectives(events: Iterable[ProfilerEvent]) -> list[ProfilerEvent]:
    """The collective events that no other collective event encloses, in order."""
    return [e for e in events if is_collective(e.name) and not _nested_in_collective(e)]


def _sent_shape(event: ProfilerEvent) -> tuple[int, ...] | None:
    shapes = list(event.input_shapes or ())
    index = _SENT_ARG.get(event.name.split("::", 1)[-1], 0)
    shape = shapes[index] if index < len(shapes) else None
    if isinstance(shape, (list, tuple)) and shape and all(isinstance(s, int) for s in shape):
        return tuple(shape)
    return None


def untyped(events: Iterable[ProfilerEvent]) -> list[EagerCollective]:
    """The outermost collectives that are not our typed ops (those ran inside lowered graphs),
    grouped by (op, shape) in order of first appearance."""
    counts: Counter[tuple[str, tuple[int, ...] | None]] = Counter()
    for event in outermost_collectives(events):
        if not event.name.startswith("tensorrt_dist::"):
            counts[(event.name, _sent_shape(event))] += 1
    return [EagerCollective(op, shape, n) for (op, shape), n in counts.items()]
