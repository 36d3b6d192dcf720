"""Proposers: the tokens a row's next step guesses, from what every rank holds alike.

A proposer is a pure function of the row's tokens (prompt, then output): every rank computes
the same proposal without a message. ``propose(tokens, k)`` returns at most ``k`` tokens, and
a shorter ``k`` gives a prefix of a longer one's proposal (the scheduler sizes a row's blocks
by the proposal's length, every rank's core proposes again with that length).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["NgramProposer", "Proposer"]


class Proposer(Protocol):
    """What the core asks of a proposer."""

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """At most ``k`` tokens to follow ``tokens`` (none: the row decodes one token)."""
        ...


class NgramProposer:
    """Prompt lookup (vLLM's ``ngram``): the row's last n tokens, for n from ``max_n`` down to
    ``min_n``, matched against its earlier tokens; at the most recent match, the tokens that
    followed it there (up to k) are the proposal. O(length x n) per call, in Python."""

    def __init__(self, *, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n ({min_n}) <= max_n ({max_n})")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        length = len(tokens)
        if k < 1:
            return []
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = list(tokens[length - n :])
            first = suffix[0]
            # the latest start i < length - n of an earlier occurrence of the suffix
            for i in range(length - n - 1, -1, -1):
                if tokens[i] == first and list(tokens[i : i + n]) == suffix:
                    return list(tokens[i + n : i + n + k])
        return []
