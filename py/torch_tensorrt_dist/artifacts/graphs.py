"""The step graphs of a set of artifacts and the calls each one takes (pure).

    graphs = step_graphs(StepLimits(rows=8, tokens=512, blocks=16, block_size=16))  # compile
    graph = pick_graph(graphs, rows=3, tokens=1, blocks=5)            # at each call

A graph is one ``torch.export`` of ``Transformer.paged_step(tokens [R, S], start [R], last [R],
past [R, NB], dest [R, S])`` with R, S and NB dynamic over the ranges recorded here (a range of
one size is a static dimension). Unlike Dynamo, which specialises sizes 0 and 1 (and so compiles
a graph per shape class: decode or prefill, one row or several, ``generation/step_inputs.py``),
``torch.export`` keeps a dimension of range [1, N] symbolic: the graph it traces runs R = 1
and S = 1 too (its reshapes copy where a view would not do). So one package runs every call
the generation core makes; the table stays a list so that a shape class worth its own package
(a decode graph with S = 1 static, say) is one more entry, picked by :func:`pick_graph`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch_tensorrt_dist.errors import ArtifactError
from torch_tensorrt_dist.generation.step_inputs import StepLimits

__all__ = ["STEP_ROLE", "GraphEntry", "limits_of", "pick_graph", "step_graphs"]

#: The role (and file name, ``rank-R/step.pt2``) of the graph that runs every call.
STEP_ROLE = "step"


@dataclass(frozen=True)
class GraphEntry:
    """One compiled graph: the inclusive ranges [low, high] of R, S and NB it accepts."""

    role: str
    rows: list[int]
    tokens: list[int]
    blocks: list[int]

    def holds(self, rows: int, tokens: int, blocks: int) -> bool:
        return all(
            lo <= n <= hi
            for n, (lo, hi) in ((rows, self.rows), (tokens, self.tokens), (blocks, self.blocks))
        )


def step_graphs(limits: StepLimits) -> list[GraphEntry]:
    """The graphs that cover every call of a core with these ``limits``: one, R in [1, rows],
    S in [1, tokens], NB in [2, blocks] (``step_inputs`` pads a table to 2 blocks at least)."""
    return [
        GraphEntry(
            STEP_ROLE, [1, limits.rows], [1, max(limits.tokens, 1)], [2, max(limits.blocks, 2)]
        )
    ]


def limits_of(graphs: Sequence[GraphEntry], block_size: int) -> StepLimits:
    """The largest call the graphs take together (the core's :class:`StepLimits`)."""
    if not graphs:
        raise ArtifactError("the manifest lists no step graph; recompile")
    return StepLimits(
        rows=max(g.rows[1] for g in graphs),
        tokens=max(g.tokens[1] for g in graphs),
        blocks=max(g.blocks[1] for g in graphs),
        block_size=block_size,
    )


def pick_graph(graphs: Sequence[GraphEntry], *, rows: int, tokens: int, blocks: int) -> GraphEntry:
    """The first graph that takes a call of ``rows`` x ``tokens`` over ``blocks`` blocks, else
    :class:`ArtifactError` naming the compiled ranges."""
    for graph in graphs:
        if graph.holds(rows, tokens, blocks):
            return graph
    ranges = "; ".join(
        f"{g.role}: rows {g.rows[0]}..{g.rows[1]}, tokens {g.tokens[0]}..{g.tokens[1]}, "
        f"blocks {g.blocks[0]}..{g.blocks[1]}"
        for g in graphs
    )
    raise ArtifactError(
        f"no compiled step graph takes {rows} rows x {tokens} tokens over {blocks} blocks "
        f"({ranges}); recompile with a larger --max-batch-size, --max-prefill-tokens or "
        "--max-seq-len"
    )
