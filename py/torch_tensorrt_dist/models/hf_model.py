"""A transformers causal LM as a model of our core: its paged step over our KV-cache pools.

    model = PagedHFModel(hf_model, args, kv=KVShape(kv_heads=2, k_dim=16, v_dim=16))
    model.setup_paged(num_blocks=256, block_size=16, max_seq_len=2048)
    logits = model.paged_step(tokens, start, last, past, dest)     # as Transformer.paged_step

``hf_model`` is transformers' own model class (built by ``parallel/hf_load.py``, sharded by its
TP plan), with ``attn_implementation`` our :data:`~.hf_attention.PAGED_ATTENTION`: each of its
attention layers hands q / k / v to ``hf_attention.paged_attention_forward``, which reads and
fills this model's pools. The step calls the model's own ``forward`` (its embedding, RoPE from
the given positions, norms, its head and its logit scaling or soft-capping) with
``logits_to_keep`` picking each row's last token, then writes every layer's K/V into the pools
after the last layer, as the native models do (``models/paged.py``).

A pipeline stage (``models/hf_stage.py``: the class with only its stage's parts, ``stage`` its
role) holds the pools of its own layers only, under their global index; its step takes the
previous stage's hidden states [R, S, dim] as ``inputs_embeds`` unless it is first, and gives
its own hidden states (the base model's output: its norm is the last stage's) unless it is
last (``generation/pipeline.py`` moves them between the ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor, nn

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.hf_attention import PagedStep
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.paged import (
    PagedKVCache,
    StepArgs,
    pack_rows,
    paged_slots,
    unpack_rows,
)
from torch_tensorrt_dist.models.stage import AbsentLayer, StageRole

__all__ = ["KVShape", "PagedHFModel"]


@dataclass(frozen=True)
class KVShape:
    """One rank's K/V per token and layer: its KV heads, the key and the value head sizes."""

    kv_heads: int
    k_dim: int
    v_dim: int

    def layout(self) -> tuple[int, int]:
        """(KV heads, head size) whose K and V of one size hold what the pools hold per token
        and layer (``generation/kv_memory.KVLayout``: 2 x heads x size elements; the size even,
        as ``ModelArgs`` wants): this shape's own where K and V together divide by 4, else one
        head of all of them (rounded up to an even size: at most 3 elements more)."""
        both = self.k_dim + self.v_dim
        if both % 4 == 0:
            return self.kv_heads, both // 2
        total = self.kv_heads * both
        return 1, -(-total // 4) * 2


class PagedHFModel(nn.Module):
    """A transformers causal LM with our paged step (what ``Generator`` runs)."""

    hf: Any
    """transformers' causal LM (an ``nn.Module``)."""

    def __init__(self, hf: nn.Module, args: ModelArgs, kv: KVShape) -> None:
        super().__init__()
        self.hf, self.args, self.kv = hf, args, kv
        #: checkpoint bytes this rank read (set by the loader)
        self.bytes_read = 0
        #: the TP group where the LM head holds a vocabulary shard (the step gathers them)
        self.group: dist.ProcessGroup | None = None
        self.kv_pools = nn.ModuleList()
        self.block_size = -1
        self.max_seq_len = -1
        self.paged_version = 0
        #: the model's dtype (what a pipeline stage's hidden states and logits travel in)
        self.hidden_dtype = torch.float32
        #: the layers this rank runs: all of them, unless it is a pipeline stage (its loader
        #: cut the others, ``models/hf_stage.cut_hf_stage``)
        self.stage = StageRole.whole(args.n_layers)

    def setup_paged(
        self,
        num_blocks: int,
        block_size: int,
        max_seq_len: int,
        *,
        dtype: torch.dtype | None = None,
        cpu_decode: bool = False,
    ) -> None:
        """Each layer's block pools (``num_blocks`` x ``block_size`` tokens, block 0 the null
        block). ``cpu_decode``: decode steps attend through the CPU op that reads the pools in
        place (``ops/cpu_attention.py``; the caller checked it is available) where K and V have
        one head size and the layer has no soft-capping or sinks; else they gather their past
        as prefill does."""
        if max_seq_len > self.args.max_seq_len:
            raise ConfigError(
                f"max_seq_len={max_seq_len} exceeds the model's limit {self.args.max_seq_len} "
                "(max_position_embeddings); ask for fewer tokens"
            )
        weight = self._model_weight()
        self.hidden_dtype = weight.dtype
        dtype = dtype or weight.dtype
        kv, device, mine = self.kv, weight.device, self.stage.layers
        self.kv_pools = nn.ModuleList(  # by global layer index: another stage's holds nothing
            PagedKVCache(
                num_blocks, block_size, kv.kv_heads, kv.k_dim, dtype, device, v_dim=kv.v_dim
            )
            if i in mine
            else AbsentLayer(i)
            for i in range(self.args.n_layers)
        )
        for pool in self.kv_pools:
            if isinstance(pool, PagedKVCache):
                pool.cpu_decode = cpu_decode and kv.k_dim == kv.v_dim
        self.block_size, self.max_seq_len = block_size, max_seq_len
        self.paged_version += 1

    def kv_dims(self) -> tuple[int, int, int, int]:
        """This rank's KV cache per token: (layers, KV heads, head size, element size), for
        ``generation/kv_memory.kv_layout`` (:meth:`KVShape.layout`: K and V of different
        sizes as heads of one size that hold as much; a pipeline stage's layers are the
        deepest stage's, ``StageRole.kv_layers``, as every rank allocates alike)."""
        pool = next((p for p in self.kv_pools if isinstance(p, PagedKVCache)), None)
        if pool is not None:  # the pools' dtype (setup_paged's)
            size = pool.k_pool.element_size()
        else:
            size = self._model_weight().element_size()
        heads, head_dim = self.kv.layout()
        return self.stage.kv_layers, heads, head_dim, size

    def _model_weight(self) -> Tensor:
        """A weight every stage holds and quantization leaves (quantized linears hold theirs
        as buffers): the model's dtype and device."""
        return next(p for p in self.hf.parameters() if p.is_floating_point())

    def paged_step(self, *args: Tensor) -> Tensor:
        """One step of R rows -> the logits of each row's last token [R, V] (``args``: a
        :class:`~torch_tensorrt_dist.models.paged.StepArgs`, as ``Transformer.paged_step``'s).
        A pipeline stage takes the previous stage's hidden states [R, S, dim] as ``tokens``
        unless it is first, and returns its own [R, S, dim] unless it is last."""
        if self.block_size < 1:
            raise ConfigError("call PagedHFModel.setup_paged(...) before running a paged step")
        inputs = StepArgs(*args)
        tokens, start, last, past, dest, live = inputs
        pos, slots = paged_slots(inputs, self.block_size)  # pos [R, S]
        step = PagedStep(start, pos, slots, past.shape[1] * self.block_size, self.kv_pools)
        keep: Tensor | int
        if live is None:  # every token's logits, then each row's last (a decode row: one)
            x, positions, keep = tokens, pos, 0
        else:  # [1, N]: the products run over the real tokens only
            x, positions = pack_rows(tokens, live), pack_rows(pos, live)
            keep = torch.cumsum(last + 1, 0) - 1  # [R]: row r's last token in the packed N
        # token ids, or (a later pipeline stage) the previous stage's hidden states
        feed = {"input_ids" if self.stage.first else "inputs_embeds": x}
        if not self.stage.last:  # the next stage's input: [R, S, dim] (padded)
            hidden = self.hf.base_model(
                **feed, position_ids=positions, use_cache=False, paged=step
            ).last_hidden_state
            if live is not None:
                hidden = unpack_rows(hidden, live, dest.shape[0], dest.shape[1])
            self._write_pools(step)
            return hidden
        out = self.hf(
            **feed, position_ids=positions, use_cache=False, logits_to_keep=keep, paged=step
        )
        logits = out.logits  # [R, S, V], or [1, R, V] packed
        if self.stage.count > 1:  # the pipeline's broadcast: in the model's dtype
            logits = logits.to(self.hidden_dtype)
        if live is None:
            r, v = logits.shape[0], logits.shape[-1]
            logits = logits.gather(1, last[:, None, None].expand(r, 1, v))
        logits = logits.reshape(start.shape[0], -1)  # [R, V or V/tp]
        if self.group is not None:  # [tp * R, V/tp] -> [R, tp * V/tp], as models/vocab.py
            r, v = logits.shape
            tp = dist.get_world_size(self.group)
            full = funcol.all_gather_single(logits.contiguous(), 0, self.group)
            logits = full.view(tp, r, v).permute(1, 0, 2).reshape(r, tp * v)
        self._write_pools(step)
        return logits

    def _write_pools(self, step: PagedStep) -> None:
        """The step's K/V into the pools, after every layer (nothing above reads them)."""
        slots = step.slots
        for pool, k, v in step.computed:
            pool(
                slots.blocks,
                slots.offsets,
                k.transpose(1, 2).flatten(0, 1),  # [T, Hkv, Dk]
                v.transpose(1, 2).flatten(0, 1),
            )
