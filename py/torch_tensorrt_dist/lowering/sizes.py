"""Sizes of graph values without specialising them: reports read a symbolic dimension's example
value (its hint) instead of ``int(size)``, which would add a guard that fixes the dimension and
makes every other size recompile."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["is_symbolic", "numel_hint", "shape_hint", "size_hint"]


def size_hint(size: Any) -> int:
    """``size`` as an int: itself, or a symbolic size's example value (-1 when it has none,
    an unbacked size). Never adds a guard."""
    if isinstance(size, int):
        return size
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        return int(hint) if hint is not None else -1
    return int(size)


def shape_hint(shape: Sequence[Any]) -> tuple[int, ...]:
    return tuple(size_hint(s) for s in shape)


def numel_hint(t: torch.Tensor) -> int:
    n = 1
    for s in shape_hint(t.shape):
        n *= max(s, 0)
    return n


def is_symbolic(t: torch.Tensor) -> bool:
    """Whether any dimension of ``t`` is symbolic (a dynamic dimension)."""
    return any(not isinstance(s, int) for s in t.shape)
