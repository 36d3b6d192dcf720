"""One token a row from probabilities, each row with its own seeded generator: the inverse of
the row's cumulative distribution at one uniform number.

    tokens = draw(probs, generators)     # probs [B, V] float32 CPU; row i draws from generators[i]

What ``torch.multinomial(p, 1)`` draws, in distribution, at the cost of vector sums over the
row and one random number, where ``torch.multinomial`` (with or without replacement) and the
exponential variates of its Gumbel-style draw take a scalar step an entry, about 20 ns here
(AMD EPYC, one thread): 3.4 ms a row at Qwen's 151,936 tokens. ``sampling.sample_each`` at
temperature 1 (this machine, one thread, a helper's job beside it; before -> after, the
row-at-a-time shift and scale above 16,384 tokens included): 8 rows of 151,936 tokens 29-40
-> 1.8-1.9 ms, one row 3.2-3.4 -> 0.30 ms; 32,000 tokens 7.1-8.9 -> 0.61 ms, one row 0.73 ->
0.16 ms; the demo model's 1,024 tokens, 8 rows 261-271 -> 201-203 us, one row 65 -> 99 us (a
dozen numpy calls of 1-2 us a row where one exponential call was). On an accelerator the
logits come to the CPU for the draw (every rank and device type draws the same), so this is
the sampled step's cost there too.

How: the row's entries are summed in chunks of :data:`CHUNK` (vector sums), the chunks'
running sums in float64 find the chunk where the uniform number (a float64 in [0, 1) times
the row's total) falls, and only that chunk's entries are summed one by one (float64) to find
the token: the first whose running sum exceeds the number (a row of at most :data:`CHUNK`
entries: summed one by one at once). A token of probability 0 is never drawn (its running
sum equals its predecessor's), nor a chunk or an entry after the last with mass. Each row
is computed from its own values and generator only, so a row draws the same token alone or
batched, and every rank the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["draw"]


#: entries a chunk: a row's chunks are summed (vector sums), the chunk that holds the draw
#: found over their running sums, and only that chunk's entries summed one by one
CHUNK = 1024


def draw(probs: Tensor, generators: Sequence[torch.Generator]) -> list[int]:
    """Row ``i`` of ``probs`` [B, V] (float32 CPU; non-negative, a finite positive sum, not
    necessarily 1) draws one token with one float64 from ``generators[i]`` (the same generator
    may repeat: it then draws row after row). ValueError for a row that is not a distribution.
    In numpy: a torch op costs 2-5 us here whatever its size, and a row's draw is a dozen
    small steps."""
    rows, vocab = probs.shape if probs.dim() == 2 else (-1, -1)
    if rows != len(generators):
        raise ValueError(f"probs {tuple(probs.shape)} for {len(generators)} generators")
    a = probs.detach().numpy()  # a view of the tensor's memory
    # chunks of CHUNK entries, or (a row of at most CHUNK) each entry its own chunk
    size, full = (CHUNK, vocab // CHUNK) if vocab > CHUNK else (1, 0)
    sums = [a[:, : full * size].reshape(rows, full, size).sum(-1)] if full else [a]
    if full and vocab % size:
        sums.append(a[:, full * size :].sum(-1, keepdims=True))
    cdf = np.cumsum(np.concatenate(sums, 1) if full else a, 1, dtype=np.float64)  # [B, chunks]
    total = cdf[:, -1]  # NaN and inf carry to it
    if not (np.isfinite(total).all() and (total > 0).all() and a.min() >= 0):
        raise ValueError(
            "probability rows must be finite and non-negative with a positive sum (a NaN, "
            "an infinity, a negative value or no mass)"
        )
    tokens = []
    for row, g in enumerate(generators):
        sums_of, end = cdf[row], total[row]
        at = float(torch.rand((), dtype=torch.float64, generator=g)) * end  # < end, or = end
        # the chunk: the first whose running sum exceeds ``at`` (it has mass), at most the
        # last chunk with mass (its running sum is the total)
        c = min(int(np.searchsorted(sums_of, at, "right")), int(np.searchsorted(sums_of, end)))
        if size == 1:
            tokens.append(c)
            continue
        local = np.cumsum(a[row, c * size : (c + 1) * size], dtype=np.float64)
        rest = at - (sums_of[c - 1] if c else 0.0)
        # the first entry whose running sum exceeds the rest, at most the chunk's last entry
        # with mass (its sums one by one round apart from its vector sum)
        j = min(int(np.searchsorted(local, rest, "right")), int(np.searchsorted(local, local[-1])))
        tokens.append(c * size + j)
    return tokens
