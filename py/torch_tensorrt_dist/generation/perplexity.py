"""Perplexity of a (sharded, compiled, possibly quantized) model over a text, in sliding windows.

    ids = document_ids(text, tokenizer)            # <s> paragraph </s>, paragraph by paragraph
    result = perplexity(model, ids, window=256, stride=128, engine="inductor")
    print(result.perplexity)

Every token after the first is predicted once: a window of ``window`` tokens scores only the
predictions no earlier window scored (the first all of its own, the others their last
``stride``), so each prediction past the first window sees at least ``window - stride`` tokens
of context. A window runs as the generation core runs a prompt: one row over the paged KV cache
(``Transformer.paged_scores``: the paged step's computation with the head over every token),
its length a dynamic dimension (one compiled graph, the shorter last window included),
returning each position's negative log likelihood; every rank computes the same numbers (the
logits are gathered), so no collective is added.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.kv_blocks import blocks_for
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
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


def _nll_step(model: Transformer) -> Callable[..., Tensor]:
    def step(
        tokens: Tensor, start: Tensor, last: Tensor, past: Tensor, dest: Tensor, targets: Tensor
    ) -> Tensor:
        # one window: tokens, targets, dest [1, L]; start, last [1]; past [1, NBp] -> nll [1, L]
        return model.paged_scores(tokens, start, last, past, dest, targets)

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
    from torch_tensorrt_dist.generation.runner import DEFAULT_BLOCK_SIZE, compile_step

    spans = windows(len(ids), window, stride)
    length = max(w.end - w.begin for w in spans)
    if length > model.args.max_seq_len:
        raise ConfigError(
            f"window {length} exceeds the model's {model.args.max_seq_len} positions; use "
            "--window with at most that many tokens"
        )
    bs = DEFAULT_BLOCK_SIZE
    blocks = list(range(1, blocks_for(length, bs) + 1))  # one window's blocks (0: the null one)
    model.setup_paged(len(blocks) + 1, bs, length)
    limits = StepLimits(rows=1, tokens=length, blocks=len(blocks), block_size=bs)
    device = model.norm.weight.device
    step = compile_step(_nll_step(model), engine, verify=verify)
    total, count = 0.0, 0
    start = time.perf_counter()
    for w in spans:
        inputs = step_inputs([(ids[w.begin : w.end], 0, blocks)], limits, device)
        targets = torch.tensor([ids[w.begin + 1 : w.end + 1]], dtype=torch.long, device=device)
        if targets.shape[1] >= 2:
            torch._dynamo.mark_dynamic(targets, 1, min=2, max=max(length, 2))
        nll = step(*inputs, targets)  # [1, n]
        total += float(nll[0, nll.shape[1] - w.scored :].double().sum())
        count += w.scored
    mean = total / count
    return PerplexityResult(math.exp(mean), mean, count, len(spans), time.perf_counter() - start)
