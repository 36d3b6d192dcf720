"""``explain``: how a (sharded) model compiles, without running an engine.

    report = torch_tensorrt_dist.explain(model, x)
    print(report)          # graphs, breaks, and one row per collective
    report.collectives     # [CollectiveInfo(op, group_ranks, reduce_op, dtype, shape, bytes)]

It compiles the model with the ``eager`` engine (so it works on a fake process group, on CPU,
for any world size), counts Dynamo's graphs and graph breaks, and lists the lowered collectives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from torch_tensorrt_dist.backend.backend import BACKEND_NAME, recording
from torch_tensorrt_dist.backend.report import (
    CollectiveInfo,
    GraphReport,
    TorchOpInfo,
    format_table,
)

__all__ = ["ExplainReport", "explain"]


@dataclass
class ExplainReport:
    """How a model compiles on this rank."""

    graph_count: int
    graph_breaks: list[str]
    collectives: list[CollectiveInfo]
    graphs: list[GraphReport] = field(default_factory=list)
    rank: int | None = None
    world_size: int | None = None
    #: the TensorRT collective implementation this process would use, and why (or why none);
    #: the CLI prints it per requested ``--collective-impl`` after the table
    tensorrt_impl: tuple[str | None, str] = (None, "")

    @property
    def unfused(self) -> list[tuple[str, str]]:
        return [item for g in self.graphs for item in g.unfused]

    @property
    def torch_ops(self) -> list[TorchOpInfo]:
        """Ops a TensorRT engine would leave to PyTorch here (each splits the engine)."""
        return [op for g in self.graphs for op in g.torch_ops]

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.collectives)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "graph_count": self.graph_count,
            "graph_breaks": list(self.graph_breaks),
            "collectives": [c.as_dict() for c in self.collectives],
            "unfused": [list(u) for u in self.unfused],
            "torch_ops": [
                {"graph": g.index, **op.as_dict()} for g in self.graphs for op in g.torch_ops
            ],
            "total_bytes": self.total_bytes,
            "tensorrt_impl": {"impl": self.tensorrt_impl[0], "reason": self.tensorrt_impl[1]},
            "input_writes": [
                {
                    "graph": g.index,
                    "in_place": len(g.written_in_place),
                    "in_place_bytes": sum(w.bytes for w in g.written_in_place),
                    "copied_back": len(g.copied_back),
                    "copied_back_bytes": sum(w.bytes for w in g.copied_back),
                }
                for g in self.graphs
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def __str__(self) -> str:
        where = f" (rank {self.rank} of {self.world_size})" if self.rank is not None else ""
        lines = [
            f"torch_tensorrt_dist explain{where}",
            f"  graphs: {self.graph_count}   graph breaks: {len(self.graph_breaks)}   "
            f"collectives: {len(self.collectives)}   bytes sent: {self.total_bytes:,}",
        ]
        lines += [f"  break: {reason}" for reason in self.graph_breaks]
        for g in self.graphs:
            if g.input_writes:
                in_place, back = g.written_in_place, g.copied_back
                lines.append(
                    f"  graph {g.index} writes inputs: {len(in_place)} in place "
                    f"({sum(w.bytes for w in in_place):,} B per call), {len(back)} copied back "
                    f"whole ({sum(w.bytes for w in back):,} B per call)"
                    + (f": {', '.join(w.input for w in back)}" if back else "")
                )
        lines += [f"  unfused {node}: {reason}" for node, reason in self.unfused]
        lines += _split_lines(self.graphs)
        if self.collectives:
            rows = []
            for g in self.graphs:
                for c in g.collectives:
                    rows.append(
                        [
                            g.index,
                            c.op,
                            list(c.group_ranks),
                            c.reduce_op or "-",
                            c.dtype,
                            list(c.shape),
                            f"{c.bytes:,}",
                            c.converts,
                            c.module or "(top)",
                        ]
                    )
            headers = ["graph", "op", "group ranks", "reduce", "dtype", "shape", "bytes"]
            table = format_table([*headers, "TensorRT", "module"], rows)
            lines += ["", *("  " + row for row in table.splitlines())]
            lines += [
                f"  {c.node}: no TensorRT {impl} layer: {reason}"
                for c in self.collectives
                for impl, reason in c.tensorrt.items()
                if reason is not None
            ]
        return "\n".join(lines)


def _split_lines(graphs: list[GraphReport]) -> list[str]:
    """Per graph: the ops TensorRT leaves to PyTorch, grouped by reason."""
    lines = []
    for g in graphs:
        if not g.torch_ops:
            continue
        n = len(g.torch_ops)
        lines.append(
            f"  graph {g.index}: {n} op(s) stay in PyTorch, so a TensorRT engine splits into up "
            f"to {n + 1} engines around them:"
        )
        by_reason: dict[str, list[TorchOpInfo]] = {}
        for op in g.torch_ops:
            by_reason.setdefault(op.reason, []).append(op)
        for reason, ops in by_reason.items():
            where = ", ".join(op.module or "(top)" for op in ops)
            lines.append(f"    {ops[0].op} {ops[0].dtype} in {where}: {reason}")
    return lines


def explain(
    model: Callable[..., Any] | torch.nn.Module,
    *example_inputs: Any,
    dynamic: bool | None = False,
    **example_kwargs: Any,
) -> ExplainReport:
    """Compile ``model`` on these inputs and report graphs, breaks and collectives.

    Runs the model once (through the ``eager`` engine); on a fake process group the collectives
    do nothing, so any world size and mesh can be explained in one CPU process.
    """
    torch._dynamo.reset()
    counters.clear()
    target = model
    if isinstance(model, torch.nn.Module):
        # compiling a call of the module (not the module) inlines its hooks, such as the
        # input/output hooks of DTensor parallel styles, into the same graph
        def target(*args: Any, **kwargs: Any) -> Any:
            return model(*args, **kwargs)

    compiled = torch.compile(
        target, backend=BACKEND_NAME, options={"engine": "eager"}, dynamic=dynamic
    )
    with recording() as graphs, torch.no_grad():
        compiled(*example_inputs, **example_kwargs)
    breaks = [
        f"{reason} (x{count})" if count > 1 else reason
        for reason, count in counters["graph_break"].items()
    ]
    torch._dynamo.reset()
    unexplained = len(graphs) - 1 - sum(counters["graph_break"].values())
    if unexplained > 0:
        breaks.append(
            f"{unexplained} more graph(s) from code Dynamo compiled as separate frames "
            "(module hooks, or functions it could not inline)"
        )
    rank = world_size = None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    from torch_tensorrt_dist.conversion.choice import current_impl

    choice = current_impl()
    return ExplainReport(
        tensorrt_impl=(choice.impl, choice.reason),
        graph_count=len(graphs),
        graph_breaks=breaks,
        collectives=[c for g in graphs for c in g.collectives],
        graphs=graphs,
        rank=rank,
        world_size=world_size,
    )
