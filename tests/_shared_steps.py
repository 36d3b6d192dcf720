"""The shared-position steps of the Llama model (every row writes the same slots
``cache_pos``, left-padded batches): the form pipeline stages run, whose KV-cache writes are
``index_copy``. The generation core runs the paged step instead (``generation.generate
.paged_step``, block writes: ``tests/_paged_graphs.py``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_tensorrt_dist.models.llama import Transformer

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def shared_decode_step(model: Transformer) -> Step:
    def decode(tokens: torch.Tensor, cache_pos: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return model(tokens, cache_pos, pad)[:, -1]

    return decode


def shared_prefill_step(model: Transformer) -> Step:
    def prefill(tokens: torch.Tensor, cache_pos: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return model(tokens, cache_pos, pad, last_only=True)[:, -1]

    return prefill


def shared_decode_example(batch: int, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of a shared-position decode step writing slot ``slot`` of every row."""
    return (
        torch.zeros(batch, 1, dtype=torch.long),
        torch.tensor([slot]),
        torch.zeros(batch, dtype=torch.long),
    )
