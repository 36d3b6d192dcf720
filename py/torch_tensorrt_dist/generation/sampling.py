"""Token sampling: greedy, temperature, top-k, top-p, from a seeded ``torch.Generator``.

Every rank holds the same logits (the LM head ends in an all-gather or is replicated) and seeds
the same generator, so every rank draws the same token without a broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.validation import check_float, check_int, check_seed

__all__ = ["TEMPERATURE_RANGE", "SamplingConfig", "make_generator", "sample"]

TEMPERATURE_RANGE = (1e-3, 100.0)
"""Non-zero temperatures allowed: below, sampling is greedy in all but name (and logits /
temperature can overflow float32); above, the distribution is uniform noise."""


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is picked."""

    temperature: float = 0.0
    """0 means greedy (argmax); else (in ``TEMPERATURE_RANGE``) samples from
    softmax(logits / temperature)."""
    top_k: int | None = None
    """Keep only the k most likely tokens (None or 0: all)."""
    top_p: float | None = None
    """Keep the smallest set of tokens whose probability reaches p (None or 1: all)."""
    seed: int = 0
    """Seed of the generator every rank creates identically."""

    def __post_init__(self) -> None:
        # NaN fails every comparison; logits / temperature must stay finite in float32
        t = self.temperature
        if not isinstance(t, int | float) or not (
            t == 0 or TEMPERATURE_RANGE[0] <= t <= TEMPERATURE_RANGE[1]
        ):
            low, high = TEMPERATURE_RANGE
            raise ConfigError(f"temperature must be 0 (greedy) or in [{low:g}, {high:g}], got {t}")
        if self.top_k is not None:
            check_int(self.top_k, name="top_k (0: all tokens)", low=0)
        if self.top_p is not None:
            check_float(self.top_p, name="top_p", low=0.0, high=1.0, low_open=True)
        check_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(cfg: SamplingConfig) -> torch.Generator:
    """A CPU generator seeded with ``cfg.seed`` (CPU so every device type draws the same)."""
    return torch.Generator(device="cpu").manual_seed(cfg.seed)


def sample(logits: Tensor, cfg: SamplingConfig, generator: torch.Generator) -> Tensor:
    """Next token per row. logits: [B, V] -> [B] int64 (on logits' device)."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    scores = logits.float().cpu() / cfg.temperature  # [B, V]
    if cfg.top_k:
        k = min(cfg.top_k, scores.shape[-1])
        kth = scores.topk(k, dim=-1).values[:, -1:]  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_scores.softmax(dim=-1) >= cfg.top_p  # mass before this token >= p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = scores.scatter(-1, order, sorted_scores)
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(logits.device)
