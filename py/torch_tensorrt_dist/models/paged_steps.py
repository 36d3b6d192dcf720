"""The paged form of the decoder: block pools per layer, and the steps that run over them.

    model.setup_paged(num_blocks=256, block_size=16, max_seq_len=2048)
    logits = model.paged_step(tokens, start, last, past, dest)              # [R, V]
    logits = model.paged_step(tokens, start, last, past, dest, every=True)  # [R, S, V]

:class:`PagedSteps` is what ``models/llama.py``'s ``Transformer`` (and every model built on
it) does over a paged KV cache: ``setup_paged`` gives every layer a pool of KV blocks,
``paged_step`` runs R rows, each a decode token or a prompt chunk over its own blocks, and
returns the logits of each row's last token, or with ``every`` those of every token (the verify
call of speculative decoding); ``paged_scores`` gives the negative log likelihood of targets
(``eval --perplexity``). The attention over the blocks, the mask and the slots are in
``models/paged.py``; a layer's ``Attention._paged`` reads them. A pipeline stage
(``models/stage.py``) runs the same steps over its own layers, taking and giving hidden
states at its boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.paged import (
    PagedKVCache,
    PagedSlots,
    StepArgs,
    pack_rows,
    paged_mask,
    paged_slots,
    unpack_rows,
)
from torch_tensorrt_dist.models.rope import rope_tables
from torch_tensorrt_dist.models.stage import StageRole
from torch_tensorrt_dist.models.vocab import VocabEmbedding


class _PagedAttention(Protocol):
    """What the steps use of a layer's attention (``llama.Attention``)."""

    n_kv_heads: int
    head_dim: int
    kv_pages: PagedKVCache | None


class _PagedBlock(Protocol):
    """What the steps use of a decoder layer (``llama.TransformerBlock``; named by its
    shape: this module is a base of the model that defines the layer)."""

    @property
    def attention(self) -> _PagedAttention: ...

    def __call__(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, where: PagedSlots
    ) -> Tensor: ...


__all__ = ["PagedSteps"]


class PagedSteps:
    """The paged steps of a decoder (a mixin of ``Transformer``, which holds what is declared
    here: its arguments, the layers this rank runs, the embedding and the head)."""

    args: ModelArgs
    stage: StageRole
    tok_embeddings: VocabEmbedding
    block_size: int
    max_seq_len: int
    paged_version: int
    rope_cos: Tensor
    rope_sin: Tensor

    if TYPE_CHECKING:

        @property
        def blocks(self) -> Sequence[_PagedBlock]: ...

        def _model_weight(self) -> Tensor: ...

        def _logits(self, x: Tensor) -> Tensor: ...

        def register_buffer(
            self, name: str, tensor: Tensor | None, persistent: bool = True
        ) -> None: ...

    def setup_paged(
        self,
        num_blocks: int,
        block_size: int,
        max_seq_len: int,
        *,
        dtype: torch.dtype | None = None,
        cpu_decode: bool = False,
    ) -> None:
        """Allocate each layer's block pools (``num_blocks`` x ``block_size`` tokens, block 0
        the null block) and the RoPE tables for positions below ``max_seq_len``.
        ``cpu_decode``: decode steps and verify calls (``every``) attend through the CPU op
        that reads the pools in place (``ops/cpu_attention.py``; the caller checked it is
        available), else every step gathers the past blocks for
        ``scaled_dot_product_attention``."""
        if max_seq_len > self.args.max_seq_len:
            raise ConfigError(
                f"max_seq_len={max_seq_len} exceeds the model's limit {self.args.max_seq_len} "
                "(max_position_embeddings); ask for fewer tokens"
            )
        weight = self._model_weight()
        dtype = dtype or weight.dtype
        for block in self.blocks:
            attn = block.attention
            attn.kv_pages = PagedKVCache(
                num_blocks, block_size, attn.n_kv_heads, attn.head_dim, dtype, weight.device
            )
            attn.kv_pages.cpu_decode = cpu_decode
        cos, sin = rope_tables(self.args, max_seq_len)
        self.register_buffer("rope_cos", cos.to(weight.device), persistent=False)
        self.register_buffer("rope_sin", sin.to(weight.device), persistent=False)
        self.block_size, self.max_seq_len = block_size, max_seq_len
        self.paged_version += 1  # a compiled step's direct calls start over (step_dispatch)

    def paged_step(self, *args: Tensor, every: bool = False) -> Tensor:
        """One step of R rows over the paged cache -> the logits of each row's last token [R, V].

        ``args``: a :class:`~torch_tensorrt_dist.models.paged.StepArgs` (tokens [R, S], start
        [R], last [R], past [R, NBp], dest [R, S], and a packed step's ``live`` [N]: its
        products run over the N real tokens only). A pipeline stage takes the previous stage's
        hidden states [R, S, dim] as ``tokens``, and one before the last returns its own for
        the next stage.

        ``every`` (speculative decoding's verify call, which checks each position of a row;
        the last stage only): the logits of every token, [R, S, V] (padding positions' are
        never used), packed [N, V] (the real tokens row by row).
        """
        if every and not self.stage.last:
            raise ValueError("paged_step(every=True) runs on a model with the LM head")
        step = StepArgs(*args)
        live, last, dest = step.live, step.last, step.dest
        x, slots = self._paged_hidden(step, few=every)  # [R | 1, S | N, dim]
        if every:
            out = self._logits(x)
            out = out if live is None else out[0]
        elif self.stage.last:
            if live is None:
                r = x.shape[0]
                x = x.gather(1, last[:, None, None].expand(r, 1, x.shape[-1]))  # [R, 1, dim]
            else:  # packed row by row: row r's last token is the (sum of lengths to r) - 1th
                x = x[0, torch.cumsum(last + 1, 0) - 1][:, None]  # [R, 1, dim]
            out = self._logits(x)[:, 0]
        else:
            out = x if live is None else unpack_rows(x, live, dest.shape[0], dest.shape[1])
        self._write_pages(slots)
        return out

    def _write_pages(self, slots: PagedSlots) -> None:
        # the step's K/V into the pools, last: nothing above reads them, and every write comes
        # after every op that is not one (one TensorRT engine, then these writes in place)
        flat = [
            (k.transpose(1, 2).flatten(0, 1), v.transpose(1, 2).flatten(0, 1))  # [R * S, Hkv, D]
            for k, v in slots.computed
        ]
        for block, (k, v) in zip(self.blocks, flat, strict=True):
            pages = block.attention.kv_pages
            assert pages is not None  # checked by every layer above
            pages(slots.blocks, slots.offsets, k, v)

    def paged_scores(
        self,
        tokens: Tensor,
        start: Tensor,
        last: Tensor,
        past: Tensor,
        dest: Tensor,
        targets: Tensor,
    ) -> Tensor:
        """The negative log likelihood of ``targets`` [R, S] at every position of the rows
        (the paged step's computation, the head over every token; nothing written) -> [R, S]
        float32. What ``eval --perplexity`` runs."""
        x, _ = self._paged_hidden(StepArgs(tokens, start, last, past, dest))
        logp = F.log_softmax(self._logits(x).float(), dim=-1)  # [R, S, V]
        return -logp.gather(-1, targets[..., None]).squeeze(-1)

    def _paged_hidden(self, step: StepArgs, *, few: bool = False) -> tuple[Tensor, PagedSlots]:
        """The last layer's output [R, S, dim] of a paged step ([1, N, dim] packed, ``live``),
        and its slots (each layer's K/V in ``slots.computed``, not written yet; ``few``: a
        verify call's few tokens a row, ``PagedSlots.few``)."""
        if self.block_size < 1:
            raise ConfigError("call Transformer.setup_paged(...) before running a paged step")
        pos, slots = paged_slots(step, self.block_size, few=few)  # pos: [R, S]
        mask = paged_mask(self.args, step.start, pos, step.past.shape[1] * self.block_size)
        tokens = step.tokens
        if step.live is not None:  # [1, N]: the products run over the real tokens only
            tokens, pos = pack_rows(tokens, step.live), pack_rows(pos, step.live)
        # tokens [R, S], or (a later pipeline stage) the previous stage's hidden [R, S, dim]
        x = self.tok_embeddings(tokens) if self.stage.first else tokens  # [R, S, dim]
        cos = self.rope_cos[pos].to(x.dtype)  # [R, S, D]
        sin = self.rope_sin[pos].to(x.dtype)
        for layer in self.blocks:
            x = layer(x, cos, sin, mask, slots)
        return x, slots
