"""Perplexity of a (sharded, compiled, possibly quantized) model over a text, in sliding windows.

    ids = document_ids(text, tokenizer)            # <s> paragraph </s>, paragraph by paragraph
    result = perplexity(model, ids, window=256, stride=128, engine="inductor")
    print(result.perplexity)

Every token after the first is predicted once: a window of ``window`` tokens scores only the
predictions no earlier window scored (the first all of its own, the others their last
``stride``), so each prediction past the first window sees at least ``window - stride`` tokens
of context. The step is one compiled graph per window length (the last, shorter window is left
padded to the same length, so there is one), returning each position's negative log
likelihood; every rank computes the same numbers (the logits are gathered), so no collective is
added.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["PerplexityResult", "document_ids", "perplexity", "windows"]


@dataclass(frozen=True)
class Window:
    """Inputs ``ids[begin:end]`` predict ``ids[begin + 1 : end + 1]``; the last ``scored``
    of those predictions count."""

    begin: int
    end: int
    scored: int


@dataclass
class PerplexityResult:
    perplexity: float
    nll: float
    """Mean negative log likelihood per scored token (nats)."""
    tokens: int
    """Predictions scored (every token after the first)."""
    windows: int
    seconds: float


def windows(n_tokens: int, window: int, stride: int) -> list[Window]:
    """The windows over ``n_tokens`` ids (pure; see the module docstring)."""
    if window < 2 or not 1 <= stride <= window:
        raise ConfigError(
            f"window {window} / stride {stride}: need window >= 2 and 1 <= stride <= window"
        )
    if n_tokens < 2:
        raise ConfigError(f"the text has {n_tokens} token(s); perplexity needs at least 2")
    out: list[Window] = []
    next_target = 1  # index of the first id no window has predicted yet
    begin = 0
    while next_target < n_tokens:
        end = min(begin + window, n_tokens - 1)
        out.append(Window(begin, end, end + 1 - next_target))
        next_target = end + 1
        begin += stride
    return out


def document_ids(text: str, tok: Tokenizer) -> list[int]:
    """Paragraphs (blank-line separated) as documents ``<s> text </s>``, concatenated, the way
    the demo model was trained (``tok.encode`` adds ``<s>``; ``</s>`` is appended where the
    tokenizer has one)."""
    eos = list(tok.eos_ids[:1])
    ids: list[int] = []
    for paragraph in (p.strip() for p in text.split("\n\n")):
        if paragraph:
            ids += tok.encode(" ".join(paragraph.split())) + eos
    return ids


def _nll_step(model: Transformer, length: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    def step(tokens: Tensor, targets: Tensor, pad: Tensor) -> Tensor:
        # tokens, targets: [1, L]; pad: [1] -> nll [1, L] float32
        cache_pos = torch.arange(length, device=tokens.device)
        logits = model(tokens, cache_pos, pad).float()  # [1, L, V]
        logp = F.log_softmax(logits, dim=-1)
        return -logp.gather(-1, targets[..., None]).squeeze(-1)

    return step


@torch.no_grad()
def perplexity(
    model: Transformer,
    ids: list[int],
    *,
    window: int = 256,
    stride: int = 128,
    engine: str = "none",
    verify: bool | None = None,
) -> PerplexityResult:
    """Perplexity of ``model`` over ``ids`` (see the module docstring)."""
    from torch_tensorrt_dist.generation.generate import compile_step

    spans = windows(len(ids), window, stride)
    length = max(w.end - w.begin for w in spans)
    if length > model.args.max_seq_len:
        raise ConfigError(
            f"window {length} exceeds the model's {model.args.max_seq_len} positions; use "
            "--window with at most that many tokens"
        )
    model.setup_caches(1, length)
    device = model.norm.weight.device
    step = compile_step(_nll_step(model, length), engine, verify=verify)
    data = torch.tensor(ids, dtype=torch.long, device=device)
    total, count = 0.0, 0
    start = time.perf_counter()
    for w in spans:
        n = w.end - w.begin
        fill = length - n  # left padding of a short last window
        tokens = torch.zeros(1, length, dtype=torch.long, device=device)
        targets = torch.zeros_like(tokens)
        tokens[0, fill:] = data[w.begin : w.end]
        targets[0, fill:] = data[w.begin + 1 : w.end + 1]
        pad = torch.tensor([fill], dtype=torch.long, device=device)
        nll = step(tokens, targets, pad)  # [1, L]
        total += float(nll[0, length - w.scored :].double().sum())
        count += w.scored
    mean = total / count
    return PerplexityResult(math.exp(mean), mean, count, len(spans), time.perf_counter() - start)
