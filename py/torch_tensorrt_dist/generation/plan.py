"""What every rank must agree on: a request, and the plan of one step (pure data).

A :class:`StepPlan` is what rank 0's scheduler decides for a step (``scheduler.py``) and what
every rank's core applies (``core.py``); ``serving/control.py`` carries it between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_tensorrt_dist.generation.grammar import GrammarSpec
from torch_tensorrt_dist.generation.sampling import SamplingConfig

__all__ = ["Request", "StepPlan"]


@dataclass(frozen=True)
class Request:
    """What every rank must know about a request to run it (rank 0 sends it on join)."""

    rid: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_ids: tuple[int, ...] = ()
    """Token ids that end the request (shown in ``tokens``, never in ``text``)."""
    stop: tuple[str, ...] = ()
    """Stop strings, matched on the decoded text (needs a tokenizer on every rank)."""
    grammar: GrammarSpec | None = None
    """What the output must match (structured output); every rank compiles it on join."""
    follows: int | None = None
    """Another choice of the same prompt (``n`` > 1): the scheduler admits this one once
    that request's prompt is computed, so that it takes the prompt's blocks from the prefix
    cache instead of computing them again."""
    group: int | None = None
    """The request of a client it belongs to, for sharing rows between clients (the
    scheduler's ``group_of``: by default the request it follows, else its own)."""


@dataclass
class StepPlan:
    """What one step does, in order: cancels, preemptions, admissions, then the rows.

    The decode rows are implicit: every running sequence whose prompt is computed and that has
    no chunk in ``chunks``."""

    cancels: list[int] = field(default_factory=list)
    preempts: list[int] = field(default_factory=list)
    joins: list[Request] = field(default_factory=list)
    """New requests, admitted this step (every rank needs their whole content)."""
    resumes: list[int] = field(default_factory=list)
    """Preempted requests admitted again."""
    cached: dict[int, int] = field(default_factory=dict)
    """Admitted request -> prefix blocks taken from the prefix cache (checked on every rank)."""
    chunks: list[tuple[int, int]] = field(default_factory=list)
    """(request, tokens) of this step's prefill rows, in order."""
    drafts: list[tuple[int, int]] = field(default_factory=list)
    """(request, k) of the decode rows that verify k proposed tokens this step (speculative
    decoding: every rank's proposer gives the same k tokens)."""
    stop: bool = False

    @property
    def steady(self) -> bool:
        """Only decode rows: nothing to tell the other ranks but the step itself."""
        return not (
            self.cancels
            or self.preempts
            or self.joins
            or self.resumes
            or self.chunks
            or self.drafts
        )
