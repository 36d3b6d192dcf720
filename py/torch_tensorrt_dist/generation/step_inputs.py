"""The inputs of one call of the step graph, and the ranges of its dynamic dimensions.

    limits = StepLimits(rows=8, tokens=512, blocks=128)
    tokens, start, last, table = step_inputs([(ids, computed, blocks), ...], limits, device)

A call runs R rows of S tokens over tables of NB blocks (``Transformer.paged_step``). Each of
R, S and NB is marked dynamic when it is 2 or more, with its range [2, limit]: Dynamo then
traces one graph for every size in the range (and TensorRT gets the range as its optimisation
profile); a size of 1 gets its own graph (Dynamo specialises sizes 0 and 1). Tables are padded
with the null block to at least 2 blocks, so NB is always dynamic. So a step graph exists in
four shapes at most: decode (S = 1) or prefill (S >= 2), one row or several.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from torch_tensorrt_dist.models.paged import NULL_BLOCK

__all__ = ["StepLimits", "mark_step_dims", "step_inputs"]


@dataclass(frozen=True)
class StepLimits:
    """The largest sizes of a step call: rows, tokens per row, blocks per table."""

    rows: int
    tokens: int
    blocks: int

    def __post_init__(self) -> None:
        if min(self.rows, self.tokens, self.blocks) < 1:
            raise ValueError(f"step limits must be >= 1: {self}")


def mark_step_dims(
    limits: StepLimits, tokens: Tensor, start: Tensor, last: Tensor, table: Tensor
) -> None:
    """Mark the dynamic dimensions of a call's inputs (sizes >= 2, ranges up to ``limits``)."""
    r, s = tokens.shape
    if r >= 2:
        for t in (tokens, start, last, table):
            torch._dynamo.mark_dynamic(t, 0, min=2, max=max(limits.rows, 2))
    if s >= 2:
        torch._dynamo.mark_dynamic(tokens, 1, min=2, max=max(limits.tokens, 2))
    torch._dynamo.mark_dynamic(table, 1, min=2, max=max(limits.blocks, 2))


def step_inputs(
    rows: Sequence[tuple[Sequence[int], int, Sequence[int]]],
    limits: StepLimits,
    device: torch.device,
    *,
    mark_dynamic: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``rows``: (the row's tokens, its start position, its blocks) -> tokens [R, S] (right
    padded with 0), start [R], last [R], table [R, NB] (padded with the null block).

    ``mark_dynamic``: mark the dynamic dimensions for Dynamo (:func:`mark_step_dims`); off
    for a step Dynamo never traces (plain PyTorch, AOTInductor packages): marking imports
    ``torch._dynamo``, seconds on the first call."""
    r = len(rows)
    s = max(len(ids) for ids, _, _ in rows)
    nb = max(2, *(len(blocks) for _, _, blocks in rows))
    if r > limits.rows or s > limits.tokens or nb > limits.blocks:
        raise ValueError(f"a step of {r} rows x {s} tokens x {nb} blocks exceeds {limits}")
    tokens = torch.zeros(r, s, dtype=torch.long)
    table = torch.full((r, nb), NULL_BLOCK, dtype=torch.long)
    for i, (ids, _, blocks) in enumerate(rows):
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.long)
    start = torch.tensor([p for _, p, _ in rows], dtype=torch.long)
    last = torch.tensor([len(ids) - 1 for ids, _, _ in rows], dtype=torch.long)
    out = (tokens.to(device), start.to(device), last.to(device), table.to(device))
    if mark_dynamic:
        mark_step_dims(limits, *out)
    return out
