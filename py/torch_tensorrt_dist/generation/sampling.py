"""Token sampling: greedy, temperature, top-k, top-p, from a seeded ``torch.Generator``.

Every rank holds the same logits (the LM head ends in an all-gather or is replicated) and seeds
the same generator, so every rank draws the same token without a broadcast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["SamplingConfig", "make_generator", "sample", "sample_rows"]


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is picked."""

    temperature: float = 0.0
    """0 means greedy (argmax); > 0 samples from softmax(logits / temperature)."""
    top_k: int | None = None
    """Keep only the k most likely tokens (None or 0: all)."""
    top_p: float | None = None
    """Keep the smallest set of tokens whose probability reaches p (None or 1: all)."""
    seed: int = 0
    """Seed of the generator every rank creates identically."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

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


def sample_rows(
    logits: Tensor, cfg: SamplingConfig, generators: Sequence[torch.Generator]
) -> Tensor:
    """Next token per row, row ``i`` drawing from ``generators[i]`` (each prompt its own, so a
    prompt samples the same tokens alone or in a batch). logits: [B, V] -> [B] int64."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    rows = [sample(logits[i : i + 1], cfg, g) for i, g in enumerate(generators)]
    return torch.cat(rows)
