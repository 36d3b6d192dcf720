"""The vocabulary-parallel ends of a decoder: the embedding lookup and the LM head.

With tensor parallelism each rank holds a slice of the vocabulary rows (padded to a multiple of
the TP size): the embedding is one all-reduce of the rows each rank looked up, the head one
all-gather of the logit shards. Both take int8 rows with a scale per row (weight-only
quantization of the embeddings). Used by the Llama decoder (and the MoE one built on it) and by
pipeline stages.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["VocabEmbedding", "embed_tokens", "lm_logits"]


def _lookup(ids: Tensor, weight: Tensor, scales: Tensor | None) -> Tensor:
    if scales is None:
        return F.embedding(ids, weight)
    # int8 rows, one scale per row (quantization.QuantizedEmbedding): only the rows looked up
    return F.embedding(ids, weight).to(scales.dtype) * F.embedding(ids, scales[:, None])


def embed_tokens(
    tokens: Tensor,
    weight: Tensor,
    group: dist.ProcessGroup | None,
    start: int = 0,
    *,
    scales: Tensor | None = None,
) -> Tensor:
    """The embedding lookup; vocabulary-parallel when ``group`` is set.

    tokens: [B, S] int64, weight: [V, dim], or this rank's rows ``[start, start + V/tp)``
    (padded) -> [B, S, dim]. A rank embeds the tokens its rows hold, zeros for the others, and
    one all-reduce(sum) assembles the rows: exact, as each token has one non-zero term.
    ``scales`` [V or V/tp]: ``weight`` holds int8 rows, dequantized as they are looked up.
    """
    if group is None:
        return _lookup(tokens, weight, scales)
    local = tokens - start
    mine = (local >= 0) & (local < weight.shape[0])  # [B, S]
    rows = _lookup(torch.where(mine, local, torch.zeros_like(local)), weight, scales)
    return funcol.all_reduce(rows.masked_fill(~mine[..., None], 0), "sum", group)


class VocabEmbedding(nn.Embedding):
    """``nn.Embedding``, vocabulary-parallel once tensor parallelism sets ``group`` and
    ``start`` (this rank's first row): see :func:`embed_tokens`."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.group: dist.ProcessGroup | None = None
        self.start = 0

    def reset_parameters(self) -> None:
        """``nn.Embedding``'s normal init, except on the meta device (a model built to be
        loaded): there is nothing to draw, and a first ``normal_`` of a meta tensor imports
        Dynamo (seconds) in a process that may never compile."""
        if not self.weight.is_meta:
            super().reset_parameters()

    def forward(self, tokens: Tensor) -> Tensor:
        return embed_tokens(tokens, self.weight, self.group, self.start)


def lm_logits(
    x: Tensor,
    head: Tensor,
    group: dist.ProcessGroup | None,
    vocab_size: int,
    *,
    scales: Tensor | None = None,
) -> Tensor:
    """``x @ head.T``; with a vocabulary-parallel head (``group`` set), the shards are gathered.

    x: [B, S, dim], head: [V or V/tp (padded), dim] -> logits [B, S, V]. ``scales``: ``head``
    holds int8 rows with one scale per row (``--quantize-embeddings``), a weight-only matmul.
    """
    if scales is None:
        logits = F.linear(x, head)  # [B, S, V] or [B, S, V_shard]
    else:
        # bfloat16 on CPU: torch's CPU weight-only kernels are vectorised for it only
        dt = torch.bfloat16 if x.device.type == "cpu" else x.dtype
        flat = torch.ops.aten._weight_int8pack_mm(
            x.reshape(-1, x.shape[-1]).to(dt), head, scales.to(dt)
        )
        logits = flat.to(x.dtype).view(*x.shape[:-1], head.shape[0])
    if group is None:
        return logits
    b, s, v = logits.shape
    tp = dist.get_world_size(group)
    # the one collective outside the layers: [tp * B, S, V/tp] -> [B, S, tp * V/tp]
    full = funcol.all_gather_single(logits.contiguous(), 0, group)
    logits = full.view(tp, b, s, v).permute(1, 2, 0, 3).reshape(b, s, tp * v)
    return logits[..., :vocab_size]  # drop the last shard's zero padding
