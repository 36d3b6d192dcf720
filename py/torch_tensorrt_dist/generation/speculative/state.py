"""A row's speculation state: how many tokens to propose next (adaptive k).

Prompt lookup costs nothing where it finds no match (the row decodes one token). Where it
matches and the target disagrees, the verify call's extra tokens are wasted, so a row's k
follows its acceptance: an exponential average ``rate`` of accepted / proposed over its verify
steps; below :data:`LOW` the row stops proposing for ``pause`` steps (2, 4, ... 64, doubling
at each pause), then tries again. A pure function of the row's verify results: the same on
every rank.
"""

from __future__ import annotations

__all__ = ["LOW", "RowSpeculation"]

#: the acceptance rate under which a row pauses its proposals
LOW = 0.3
_DECAY = 0.7
_MAX_PAUSE = 64


class RowSpeculation:
    """One sequence's adaptive k and its counts."""

    def __init__(self, k: int) -> None:
        self.k_max = k
        self.rate = 1.0
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
        self.rate = _DECAY * self.rate + (1 - _DECAY) * accepted / proposed
        if self.rate < LOW:
            self._pause = min(2 * self._pause, _MAX_PAUSE)
            self.paused = self._pause
            self.rate = 2 * LOW  # one more bad step pauses again
