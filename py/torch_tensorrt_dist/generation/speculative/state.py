"""A row's speculation state: how many tokens to propose next (adaptive k).

Prompt lookup costs nothing where it finds no match (the row decodes one token). Where it
matches and the target disagrees, the verify call costs more than the decode step it
replaces for nothing, so a row's k follows what its verify steps bring: an exponential average
``gain`` of the proposed tokens accepted a verify step; below :data:`LOW` the row stops
proposing for ``pause`` steps (2, 4, ... 64, doubling at each pause), then tries again. A pure
function of the row's verify results: the same on every rank.

The measure is tokens a step, not accepted / proposed: a verify call of one row x (k + 1)
tokens costs about 1.2 decode steps on a CPU (``docs/generation.md``) whatever k is, so a
row that accepts 1 of 4 proposed tokens a step gains (a rate of 0.25 paused it before), and
one that accepts less than about 0.3 tokens a step loses.
"""

from __future__ import annotations

__all__ = ["LOW", "RowSpeculation"]

#: the accepted tokens a verify step (exponential average) under which a row pauses
LOW = 0.4
_DECAY = 0.7
_MAX_PAUSE = 64


class RowSpeculation:
    """One sequence's adaptive k and its counts."""

    def __init__(self, k: int) -> None:
        self.k_max = k
        self.gain = 1.0
        """Accepted tokens a verify step, an exponential average (starting at one)."""
        self.paused = 0
        """Steps left without proposals."""
        self._pause = 1
        self.proposed = 0
        self.accepted = 0
        self.steps = 0
        """Verify steps taken."""

    def k(self) -> int:
        """Tokens to propose at this step (0 while paused)."""
        return 0 if self.paused else self.k_max

    def tick(self) -> None:
        """A step without a verify (call once per decode step of the row)."""
        if self.paused:
            self.paused -= 1

    def update(self, proposed: int, accepted: int) -> None:
        """A verify step's result: ``accepted`` of ``proposed`` tokens."""
        self.proposed += proposed
        self.accepted += accepted
        self.steps += 1
        self.gain = _DECAY * self.gain + (1 - _DECAY) * accepted
        if self.gain < LOW:
            self._pause = min(2 * self._pause, _MAX_PAUSE)
            self.paused = self._pause
            self.gain = 2 * LOW  # two more steps that accept nothing pause it again
