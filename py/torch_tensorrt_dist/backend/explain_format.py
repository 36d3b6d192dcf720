"""The text form of an ``explain`` report (pure: reads the report, prints nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torch_tensorrt_dist.backend.collective_events import EagerCollective
from torch_tensorrt_dist.backend.report import (
    CollectiveInfo,
    GraphReport,
    TorchOpInfo,
    format_table,
)

__all__ = ["ExplainedCall", "format_report", "unit_pattern"]


class ExplainedCall(Protocol):
    """What the text form reads of ``explain``'s report (``backend/explain.py``)."""

    rank: int | None
    world_size: int | None
    graph_count: int
    graph_breaks: list[str]
    collectives: list[CollectiveInfo]
    graphs: list[GraphReport]
    compile_units: list[str]
    outside_graphs: list[EagerCollective] | None

    @property
    def unfused(self) -> Sequence[tuple[str, str]]: ...
    @property
    def in_graphs_per_call(self) -> int: ...
    @property
    def collectives_per_call(self) -> int: ...
    @property
    def bytes_per_call(self) -> int: ...
    @property
    def reused_graphs(self) -> list[GraphReport]: ...


def _ranges(numbers: list[int]) -> str:
    out: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        if n is not None:
            start = prev = n
    return ",".join(out)


def unit_pattern(units: list[str]) -> str:
    """``layers.[1-5]`` for blocks ``layers.1`` ... ``layers.5`` (siblings with numeric names),
    ``layers.[a,b]`` for other siblings, the names joined by ``, `` otherwise."""
    if len(units) == 1:
        return units[0]
    parents = {u.rpartition(".")[0] for u in units}
    leaves = [u.rpartition(".")[2] for u in units]
    if len(parents) != 1 or any(u == "" for u in units):
        return ", ".join(units)
    parent = parents.pop()
    prefix = f"{parent}." if parent else ""
    if all(leaf.isdigit() for leaf in leaves):
        return f"{prefix}[{_ranges(sorted(int(leaf) for leaf in leaves))}]"
    return f"{prefix}[{','.join(leaves)}]"


def _module(name: str, graph: GraphReport) -> str:
    """A module name of a graph that serves several blocks, with the block as a pattern."""
    units = [u for u in graph.units if u]
    if len(units) > 1:
        for unit in units:
            if name == unit or name.startswith(unit + "."):
                return unit_pattern(units) + name[len(unit) :]
    return name or "(top)"


def _graphs_field(report: ExplainedCall) -> str:
    text = f"graphs: {report.graph_count}"
    if report.compile_units:
        text += f" for {len(report.compile_units)} blocks compiled one by one"
    reused = []
    for g in report.reused_graphs:
        units = [u for u in g.units if u]
        where = f": one graph reused by {unit_pattern(units)}" if len(units) > 1 else ""
        reused.append(f"graph {g.index} runs {g.runs}x per call{where}")
    return text + (f" ({'; '.join(reused)})" if reused else "")


def _collectives_field(report: ExplainedCall) -> str:
    listed = len(report.collectives)
    outside = report.outside_graphs
    if outside is None:
        return (
            f"collectives: {report.in_graphs_per_call} per call in graphs ({listed} listed: "
            "each graph once; outside graphs not counted: a profiler was running)"
        )
    n_outside = sum(c.count for c in outside)
    return (
        f"collectives: {report.collectives_per_call} per call ({listed} listed: each graph "
        f"once; {n_outside} outside graphs)"
    )


def _paged_line(g: GraphReport) -> list[str]:
    """Per graph: what the paged KV cache's ops become under TensorRT, counted by form."""
    if not g.paged:
        return []
    counts: dict[tuple[str, str], int] = {}
    for op in g.paged:
        counts[(op.kind, op.form)] = counts.get((op.kind, op.form), 0) + 1
    parts = [f"{n} {kind} -> {form}" for (kind, form), n in counts.items()]
    return [f"  graph {g.index} paged KV under TensorRT: {'; '.join(parts)}"]


def _split_lines(graphs: list[GraphReport]) -> list[str]:
    """Per graph: the ops TensorRT leaves to PyTorch, grouped by reason."""
    lines = []
    for g in graphs:
        lines += _paged_line(g)
        if not g.torch_ops:
            continue
        n = len(g.torch_ops)
        if g.engines is None:
            split = f"up to {n + 1} TensorRT engines"
        else:
            split = f"{g.engines} TensorRT engine{'' if g.engines == 1 else 's'}"
        lines.append(f"  graph {g.index}: {n} op(s) stay in PyTorch, with {split} around them:")
        by_reason: dict[str, list[TorchOpInfo]] = {}
        for op in g.torch_ops:
            by_reason.setdefault(op.reason, []).append(op)
        for reason, ops in by_reason.items():
            where = ", ".join(dict.fromkeys(op.module or "(top)" for op in ops))
            lines.append(f"    {ops[0].op} {ops[0].dtype} in {where}: {reason}")
    return lines


def format_report(report: ExplainedCall) -> str:
    where = f" (rank {report.rank} of {report.world_size})" if report.rank is not None else ""
    lines = [
        f"torch_tensorrt_dist explain{where}",
        f"  {_graphs_field(report)}   graph breaks: {len(report.graph_breaks)}   "
        f"{_collectives_field(report)}   bytes sent per call in graphs: "
        f"{report.bytes_per_call:,}",
    ]
    lines += [f"  break: {reason}" for reason in report.graph_breaks]
    for g in report.graphs:
        if g.input_writes:
            in_place, back = g.written_in_place, g.copied_back
            lines.append(
                f"  graph {g.index} writes inputs: {len(in_place)} in place "
                f"({sum(w.bytes for w in in_place):,} B per call), {len(back)} copied back "
                f"whole ({sum(w.bytes for w in back):,} B per call)"
                + (f": {', '.join(w.input for w in back)}" if back else "")
            )
    lines += [f"  unfused {node}: {reason}" for node, reason in report.unfused]
    lines += _split_lines(report.graphs)
    if report.collectives:
        rows = [
            [
                g.index,
                g.runs,
                c.op,
                list(c.group_ranks),
                c.reduce_op or "-",
                c.dtype,
                list(c.shape),
                f"{c.bytes:,}",
                c.converts,
                _module(c.module, g),
            ]
            for g in report.graphs
            for c in g.collectives
        ]
        headers = ["graph", "runs", "op", "group ranks", "reduce", "dtype", "shape", "bytes"]
        table = format_table([*headers, "TensorRT", "module"], rows)
        lines += ["", *("  " + row for row in table.splitlines())]
    for c in report.outside_graphs or ():
        shape = f" {list(c.shape)}" if c.shape is not None else ""
        lines.append(f"  outside graphs: {c.kind}{shape} x{c.count} per call ({c.op})")
    lines += [
        f"  {c.node}: no TensorRT {impl} layer: {reason}"
        for c in report.collectives
        for impl, reason in c.tensorrt.items()
        if reason is not None
    ]
    return "\n".join(lines)
