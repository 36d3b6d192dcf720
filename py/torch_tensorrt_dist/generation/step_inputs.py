"""The inputs of one call of the step graph, and the ranges of its dynamic dimensions.

    limits = StepLimits(rows=8, tokens=512, blocks=128, block_size=16)
    tokens, start, last, past, dest = step_inputs([(ids, computed, blocks), ...], limits, dev)

A call runs R rows of S tokens, each over its past blocks (NBp of them: ``past``) and writing
its tokens into ``dest`` (``Transformer.paged_step``, ``models/paged.py``). Each of R, S and
NBp is marked dynamic when it is 2 or more, with its range [2, limit]: Dynamo then traces one
graph for every size in the range (and TensorRT gets the range as its optimisation profile); a
size of 1 gets its own graph (Dynamo specialises sizes 0 and 1). Past tables are padded with
the null block to at least 2 blocks, so NBp is always dynamic. So a step graph exists in four
shapes at most: decode (S = 1) or prefill (S >= 2), one row or several.

A prefill of several rows (``pack=True``) is packed: a sixth input, ``live`` [N], holds the flat
index ``r * S + s`` of each real token (N dynamic, [2, rows x tokens]), and the step's products
run over those N tokens, not R x S (``models/paged.py``, ``pack_rows``): a prompt joining 7
decoding rows is 17 tokens, not 8 x 10.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from torch_tensorrt_dist.generation.kv_blocks import blocks_for
from torch_tensorrt_dist.models.paged import NULL_BLOCK

if TYPE_CHECKING:
    from torch_tensorrt_dist.models.llama import Transformer

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "StepFn",
    "StepLimits",
    "decode_example",
    "mark_step_dims",
    "past_split",
    "prefill_example",
    "setup_example",
    "step_inputs",
    "warmup_prompts",
]

#: the step graph's call: ``(tokens [R, S], start [R], last [R], past [R, NBp], dest [R, S])
#: -> logits [R, V]``
StepFn = Callable[..., Tensor]

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class StepLimits:
    """The largest sizes of a step call: rows, tokens per row, blocks per table; and the block
    size (tokens per block)."""

    rows: int
    tokens: int
    blocks: int
    block_size: int

    def __post_init__(self) -> None:
        if min(self.rows, self.tokens, self.blocks, self.block_size) < 1:
            raise ValueError(f"step limits must be >= 1: {self}")


def mark_step_dims(limits: StepLimits, *inputs: Tensor) -> None:
    """Mark the dynamic dimensions of a call's inputs ``(tokens, start, last, past, dest)``
    and a packed step's ``live``: sizes >= 2, ranges up to ``limits`` (a later pipeline
    stage's hidden state [R, S, dim] in the place of the tokens: its rows and tokens)."""
    tokens, past, dest = inputs[0], inputs[3], inputs[4]
    r, s = tokens.shape[:2]
    if len(inputs) > 5:
        most = max(limits.rows * limits.tokens, 2)
        torch._dynamo.mark_dynamic(inputs[5], 0, min=2, max=most)
    if r >= 2:
        for t in inputs[:5]:
            torch._dynamo.mark_dynamic(t, 0, min=2, max=max(limits.rows, 2))
    if s >= 2:
        for t in (tokens, dest):
            torch._dynamo.mark_dynamic(t, 1, min=2, max=max(limits.tokens, 2))
    torch._dynamo.mark_dynamic(past, 1, min=2, max=max(limits.blocks, 2))


def step_inputs(
    rows: Sequence[tuple[Sequence[int], int, Sequence[int]]],
    limits: StepLimits,
    device: torch.device,
    *,
    mark_dynamic: bool = True,
    pack: bool = False,
) -> tuple[Tensor, ...]:
    """``rows``: (the row's tokens, its start position, its blocks: those of its past and of
    these tokens) -> tokens [R, S] (right padded with 0), start [R], last [R], past [R, NBp]
    (the blocks of positions < start, padded with the null block), dest [R, S] (each token's
    block; the null block for padding); with ``pack`` and R, S >= 2, live [N] too (the flat
    indices of the real tokens, row by row).

    ``mark_dynamic``: mark the dynamic dimensions for Dynamo (:func:`mark_step_dims`); off
    for a step Dynamo never traces (plain PyTorch, AOTInductor packages): marking imports
    ``torch._dynamo``, seconds on the first call."""
    bs = limits.block_size
    r = len(rows)
    s = max(len(ids) for ids, _, _ in rows)
    nbp = max(2, *(-(-p // bs) for _, p, _ in rows))
    if r > limits.rows or s > limits.tokens or nbp > limits.blocks:
        raise ValueError(f"a step of {r} rows x {s} tokens x {nbp} blocks exceeds {limits}")
    # padded Python rows, then one tensor each: a few calls per step, not a few per row
    tok_rows, past_rows, dest_rows = [], [], []
    for ids, p, blocks in rows:
        pad = s - len(ids)
        held = -(-p // bs)
        tok_rows.append([*ids, *[0] * pad])
        past_rows.append([*blocks[:held], *[NULL_BLOCK] * (nbp - held)])
        dest_rows.append([*(blocks[(p + j) // bs] for j in range(len(ids))), *[NULL_BLOCK] * pad])
    tokens = torch.tensor(tok_rows, dtype=torch.long)
    past = torch.tensor(past_rows, dtype=torch.long)
    dest = torch.tensor(dest_rows, dtype=torch.long)
    start = torch.tensor([p for _, p, _ in rows], dtype=torch.long)
    last = torch.tensor([len(ids) - 1 for ids, _, _ in rows], dtype=torch.long)
    out: tuple[Tensor, ...] = (
        tokens.to(device),
        start.to(device),
        last.to(device),
        past.to(device),
        dest.to(device),
    )
    if pack and r >= 2 and s >= 2:
        live = [i * s + j for i, (ids, _, _) in enumerate(rows) for j in range(len(ids))]
        out += (torch.tensor(live, dtype=torch.long).to(device),)
    if mark_dynamic:
        mark_step_dims(limits, *out)
    return out


def warmup_prompts(max_rows: int, longest: int, split: int) -> list[list[list[int]]]:
    """The prompts a warm-up generates (two tokens each), one list per run, so that every graph
    a step can take compiles: one row or several, decode or prefill (the longest chunk too),
    the most rows at once (a MoE layer may pick its form by it), and on each side of ``split``
    token rows (rows x tokens: ``cpu_gemm="reduce"`` compiles the step twice and picks by
    them, ``generate.compile_paged_step``) where a step can reach past it."""
    two = min(2, max_rows)
    wide = min(longest, split // 2 + 1)
    rows = min(max_rows, max(2, -(-(split + 1) // wide)))
    shapes = [[[0] * 2] * two, [[0] * 2], [[0] * longest], [[0] * wide] * rows]
    if max_rows > 2:
        shapes.append([[0] * 2] * max_rows)
    return shapes


def past_split(max_rows: int, tokens: int, split: int) -> list[tuple[int, int]]:
    """(rows, tokens) of prefill calls past ``split`` token rows, one row and several, where
    steps of at most ``max_rows`` rows and ``tokens`` tokens can reach past it: what a warm-up
    runs directly, whatever the scheduler's chunks would make of its prompts."""
    calls = [(1, tokens)] if tokens > split else []
    rows = min(max_rows, max(2, -(-(split + 1) // tokens)))
    if rows >= 2 and tokens >= 2 and rows * tokens > split:
        calls.append((rows, tokens))
    return calls


def setup_example(
    model: Transformer, rows: int, tokens: int, block_size: int = DEFAULT_BLOCK_SIZE
) -> None:
    """A paged cache with room for ``rows`` sequences of ``tokens`` tokens (explain, benches)."""
    model.setup_paged(rows * blocks_for(tokens, block_size) + 1, block_size, tokens)


def decode_example(
    rows: int,
    tokens: int = 64,
    *,
    position: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> tuple[Tensor, ...]:
    """Inputs of a decode step of ``rows`` rows, each at ``position`` (default: half of
    ``tokens``) with its own ``tokens`` tokens of blocks (a cache of :func:`setup_example`)."""
    blocks = blocks_for(tokens, block_size)
    pos = tokens // 2 if position is None else position
    table = [list(range(1 + i * blocks, 1 + (i + 1) * blocks)) for i in range(rows)]
    spans = [([0], pos, t) for t in table]
    return step_inputs(spans, StepLimits(rows, 1, max(blocks, 2), block_size), torch.device("cpu"))


def prefill_example(length: int, *, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[Tensor, ...]:
    """Inputs of the prefill of one ``length``-token prompt into the first blocks."""
    blocks = blocks_for(length, block_size)
    spans = [([0] * length, 0, list(range(1, blocks + 1)))]
    return step_inputs(
        spans, StepLimits(1, length, max(blocks, 2), block_size), torch.device("cpu")
    )
