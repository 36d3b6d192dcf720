"""Token sampling: greedy, temperature, top-k, top-p, from a seeded ``torch.Generator``.

Every rank holds the same logits (the LM head ends in an all-gather or is replicated) and seeds
the same generator, so every rank draws the same token without a broadcast.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.validation import check_float, check_int, check_seed

__all__ = [
    "TEMPERATURE_RANGE",
    "SamplingConfig",
    "check_top_p",
    "make_generator",
    "sample",
    "sample_rows",
]

TEMPERATURE_RANGE = (1e-3, 100.0)
"""Non-zero temperatures allowed: below, sampling is greedy in all but name (and logits /
temperature can overflow float32); above, the distribution is uniform noise."""


def _float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def check_top_p(value: float, *, name: str = "top_p") -> float:
    """``value`` as a top_p in (0, 1] that stays above 0 in float32, the precision sampling
    compares in (ConfigError otherwise): 1e-300 would be 0 there."""
    p = check_float(value, name=name, low=0.0, high=1.0, low_open=True)
    if _float32(p) == 0.0:
        raise ConfigError(
            f"{name} {p:g} is 0 in float32, the precision sampling runs in; give a value "
            f">= {2.0**-149:.3g} (the smallest positive float32) or leave it unset"
        )
    return p


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
            check_top_p(self.top_p)
        check_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(cfg: SamplingConfig) -> torch.Generator:
    """A CPU generator seeded with ``cfg.seed`` (CPU so every device type draws the same)."""
    return torch.Generator(device="cpu").manual_seed(cfg.seed)


def sample(logits: Tensor, cfg: SamplingConfig, generator: torch.Generator) -> Tensor:
    """Next token per row. logits: [B, V] -> [B] int64 (on logits' device).

    Every accepted setting keeps at least one token: the row's maximum is subtracted before
    dividing by the temperature (finite logits stay finite at any temperature), and top-p
    always keeps the most likely token (a top_p below float32's resolution keeps only it)."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    scores = logits.float().cpu()  # [B, V]
    scores = (scores - scores.max(dim=-1, keepdim=True).values) / cfg.temperature
    if cfg.top_k:
        k = min(cfg.top_k, scores.shape[-1])
        kth = scores.topk(k, dim=-1).values[:, -1:]  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_scores.softmax(dim=-1) >= cfg.top_p  # mass before this token >= p
        drop[:, 0] = False  # the most likely token always stays
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
