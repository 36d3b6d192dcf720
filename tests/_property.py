"""Random collective programs for the property test of ``fuse_collectives``.

A program is a list of steps over a growing list of ``[rows, 3]`` tensors. Each collective step
gets 0, 1 or 2 ``wait_tensor`` nodes, placed any number of steps later; coalesced and in-place
variants appear too. The reference interpreter runs every collective synchronously, so it is the
truth even for a graph that reads a collective's result without waiting.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from torch import fx

F = torch.ops._c10d_functional
aten = torch.ops.aten

KINDS = (
    "all_reduce",
    "all_reduce_",
    "coalesced",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "pointwise",
)
REDUCE = ("sum", "avg", "min", "max")


@dataclass(frozen=True)
class Step:
    kind: str
    src: int  # index into the values so far (taken modulo their number)
    reduce_op: str
    waits: int  # number of wait_tensor nodes (collectives)
    wait_delay: int  # steps after which the waits are placed


@st.composite
def programs(draw: Any) -> list[Step]:
    n = draw(st.integers(1, 6))
    return [
        Step(
            kind=draw(st.sampled_from(KINDS)),
            src=draw(st.integers(0, 10)),
            reduce_op=draw(st.sampled_from(REDUCE)),
            waits=draw(st.integers(0, 2)),
            wait_delay=draw(st.integers(0, 3)),
        )
        for _ in range(n)
    ]


def _valid(step: Step, rows: int, n: int) -> bool:
    if step.kind in ("reduce_scatter", "all_to_all"):
        return rows % n == 0 and rows // n >= 1
    if step.kind == "all_gather":
        return rows * n <= 64
    return True


def build(program: list[Step], gn: str, n: int) -> fx.GraphModule:
    """The program as an aten graph with c10d functional collectives and waits."""
    g = fx.Graph()
    x = g.placeholder("x")
    values: list[tuple[fx.Node, int]] = [(x, 8)]
    pending: list[tuple[int, fx.Node, int]] = []  # (due step, node to wait on, count)
    for i, step in enumerate(program):
        for due, node, count in [p for p in pending if p[0] <= i]:
            for _ in range(count):
                g.call_function(F.wait_tensor.default, (node,))
            pending.remove((due, node, count))
        src, rows = values[step.src % len(values)]
        if not _valid(step, rows, n):
            continue
        k = step.kind
        if k == "pointwise":
            values.append(
                (
                    g.call_function(
                        aten.add.Tensor, (g.call_function(aten.sin.default, (src,)), 1.0)
                    ),
                    rows,
                )
            )
            continue
        if k == "all_reduce":
            out = g.call_function(F.all_reduce.default, (src, step.reduce_op, gn))
        elif k == "all_reduce_":
            out = g.call_function(aten.clone.default, (src,))
            g.call_function(F.all_reduce_.default, (out, step.reduce_op, gn))
        elif k == "coalesced":
            co = g.call_function(F.all_reduce_coalesced.default, ([src, src], step.reduce_op, gn))
            out = g.call_function(operator.getitem, (co, 1))
        elif k == "all_gather":
            out = g.call_function(F.all_gather_into_tensor.default, (src, n, gn))
            rows *= n
        elif k == "reduce_scatter":
            out = g.call_function(F.reduce_scatter_tensor.default, (src, step.reduce_op, n, gn))
            rows //= n
        elif k == "all_to_all":
            split = [rows // n] * n
            out = g.call_function(F.all_to_all_single.default, (src, split, split, gn))
        else:
            out = g.call_function(F.broadcast.default, (src, n - 1, gn))
        values.append((out, rows))
        if step.waits:
            pending.append((i + 1 + step.wait_delay, out, step.waits))
    for _, node, count in pending:
        for _ in range(count):
            g.call_function(F.wait_tensor.default, (node,))
    # sum every value into the output so nothing is dead code
    total = g.call_function(aten.sum.default, (x,))
    for node, _ in values[1:]:
        total = g.call_function(
            aten.add.Tensor, (total, g.call_function(aten.sum.default, (node,)))
        )
    g.output(total)
    return fx.GraphModule(torch.nn.Module(), g)


def reference(program: list[Step], x: torch.Tensor, gn: str, n: int) -> torch.Tensor:
    """Run the program with every collective completed at once (the synchronous truth)."""
    W = F.wait_tensor
    values: list[tuple[torch.Tensor, int]] = [(x, 8)]
    for step in program:
        src, rows = values[step.src % len(values)]
        if not _valid(step, rows, n):
            continue
        k = step.kind
        if k == "pointwise":
            out = torch.sin(src) + 1.0
        elif k in ("all_reduce", "all_reduce_", "coalesced"):
            out = W(F.all_reduce(src, step.reduce_op, gn))
        elif k == "all_gather":
            out, rows = W(F.all_gather_into_tensor(src, n, gn)), rows * n
        elif k == "reduce_scatter":
            out, rows = W(F.reduce_scatter_tensor(src, step.reduce_op, n, gn)), rows // n
        elif k == "all_to_all":
            split = [rows // n] * n
            out = W(F.all_to_all_single(src, split, split, gn))
        else:
            out = W(F.broadcast(src, n - 1, gn))
        values.append((out, rows))
    total = x.sum()
    for t, _ in values[1:]:
        total = total + t.sum()
    return total


def check_random_programs(rank: int, world: int, max_examples: int) -> int:
    """Each rank runs the same derandomised examples in lockstep (no shrinking: a shrink on one
    rank would desynchronise the collectives)."""
    import torch.distributed as dist
    from hypothesis import HealthCheck, Phase, given, settings

    from torch_tensorrt_dist import fuse_collectives
    from torch_tensorrt_dist.lowering import fusion_report
    from torch_tensorrt_dist.lowering.fuse_collectives import SOURCE_COLLECTIVES

    gn = dist.group.WORLD.group_name  # type: ignore[union-attr]
    x = torch.linspace(-1, 1, 24).view(8, 3) * (rank + 1)
    seen = []

    @settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=max_examples,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs())
    def check(program: list[Step]) -> None:
        gm = build(program, gn, world)
        fused = fuse_collectives(copy.deepcopy(gm), strict=True)
        assert fusion_report(fused).unfused == []
        left = [
            n
            for n in fused.graph.nodes
            if n.target in SOURCE_COLLECTIVES or n.target is F.wait_tensor.default
        ]
        assert not left, fused.code
        out = fused(x.clone())
        want = reference(program, x.clone(), gn, world)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)
        # idempotent
        assert fuse_collectives(copy.deepcopy(fused)).code == fused.code
        seen.append(len(program))

    check()
    return len(seen)
