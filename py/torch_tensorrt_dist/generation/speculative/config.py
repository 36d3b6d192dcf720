"""What ``--speculative`` and ``--num-speculative-tokens`` ask for, validated."""

from __future__ import annotations

from dataclasses import dataclass

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["METHODS", "SPECULATIVE_TOKENS_RANGE", "SpeculativeConfig"]

#: proposers (``ngram``: prompt lookup; ``draft``: a draft model's greedy tokens)
METHODS = ("ngram", "draft")
#: the range of ``--num-speculative-tokens``
SPECULATIVE_TOKENS_RANGE = (1, 16)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: the proposer and the most tokens it proposes a step."""

    method: str = "ngram"
    """``ngram``: prompt lookup over the row's prompt and output (:class:`NgramProposer`);
    ``draft``: a draft model's greedy tokens (:class:`~.draft.DraftProposer`)."""
    num_tokens: int = 4
    """k, the most tokens proposed for a row in one step (``--num-speculative-tokens``)."""
    min_n: int = 2
    """The shortest suffix the lookup matches (vLLM's ``prompt_lookup_min``; a single token
    matches too often on text that does not repeat)."""
    max_n: int = 3
    """The longest suffix the lookup tries first (vLLM's ``prompt_lookup_max``)."""
    draft_model: str | None = None
    """``--draft-model``: the draft model's checkpoint (``draft``; the command line loads it
    as it loads the target)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"--speculative {self.method!r} is not one of {', '.join(METHODS)}")
        if self.draft_model is not None and self.method != "draft":
            raise ConfigError("--draft-model needs --speculative draft")
        low, high = SPECULATIVE_TOKENS_RANGE
        k = self.num_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not low <= k <= high:
            raise ConfigError(
                f"--num-speculative-tokens must be an integer in [{low}, {high}], got {k!r}"
            )
        if not 1 <= self.min_n <= self.max_n:
            raise ConfigError(
                f"the lookup's n-gram sizes must satisfy 1 <= min ({self.min_n}) <= "
                f"max ({self.max_n})"
            )
