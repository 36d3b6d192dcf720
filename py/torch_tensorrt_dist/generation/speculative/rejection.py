"""The acceptance rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for a
draft that is one token (a point mass: prompt lookup, or a greedy draft model).

With target probabilities p and a draft q that puts all its mass on x, the rule "accept x with
probability min(1, p(x) / q(x)), else draw from norm(max(p - q, 0))" becomes: accept x with
probability p(x); else draw from p with x's mass removed, renormalised. The token that results
has distribution p exactly: P(x) = p(x), and for y != x, (1 - p(x)) p(y) / (1 - p(x)) = p(y).
Every draw comes from the request's seeded generator: every rank draws the same.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torch_tensorrt_dist.generation.draw import draw

__all__ = ["accept_point_mass"]


def accept_point_mass(probs: Tensor, draft: int, generator: torch.Generator) -> tuple[bool, int]:
    """``probs`` [V] (float32, CPU, summing to 1): (whether ``draft`` is accepted, the token:
    ``draft``, or the replacement drawn from the residual distribution)."""
    p = float(probs[draft])
    u = float(torch.rand((), generator=generator))
    if u < p:
        return True, draft
    residual = probs.clone()
    residual[draft] = 0.0
    # p(draft) < 1 here (u < 1 always): the residual holds mass (draw: not normalised)
    token = draw(residual.unsqueeze(0), [generator])[0]
    return False, token
