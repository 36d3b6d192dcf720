"""Attention of a transformers model through our paged KV cache: the function registered in
transformers' ``AttentionInterface`` under :data:`PAGED_ATTENTION`.

    register_paged_attention()
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation=PAGED_ATTENTION)
    hf(input_ids=ids, position_ids=pos, use_cache=False, paged=PagedStep(...))

The model's attention module computes q / k / v with its own projections, norms and RoPE and
calls :func:`paged_attention_forward` with them (``q [B, Hq, S, Dk]``, ``k [B, Hkv, S, Dk]``,
``v [B, Hkv, S, Dv]``; B = R rows, or 1 for a packed step) and the keyword arguments it passes
every backend: ``scaling``, ``sliding_window`` (None for full attention), ``softcap`` (logit
soft-capping), ``s_aux`` (attention sinks, one logit per query head). The step's own state (its
slots, positions and the layers' pools) arrives as the ``paged`` keyword, which transformers
passes through its modules' ``**kwargs`` to here. Each layer attends over its row's past blocks
and its own chunk, as the native models do (``models/paged.py``), and leaves its K/V in
``paged.computed`` for the step to write after the last layer.

transformers builds no mask for a backend it does not know (``masking_utils``: the mask is None
here): the mask is ours, from the positions, per sliding window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.paged import PagedKVCache, PagedSlots, pack_rows, unpack_rows
from torch_tensorrt_dist.ops.cpu_attention import decode_attention

__all__ = [
    "PAGED_ATTENTION",
    "PagedStep",
    "attend",
    "paged_attention_forward",
    "register_paged_attention",
    "window_mask",
]

#: the name of our attention function in transformers' ``AttentionInterface``
PAGED_ATTENTION = "torchtrt_dist_paged"


@dataclass
class PagedStep:
    """What every layer's attention reads in one step: the rows' first positions ``start``
    [R], the tokens' positions ``pos`` [R, S] (unpacked), the slots (``models/paged.py``),
    the past's key count (NBp * bs), the layers' pools (by ``layer_idx``); each layer appends
    ``(pool, k, v)`` to ``computed``."""

    start: Tensor
    pos: Tensor
    slots: PagedSlots
    past_keys: int
    pools: nn.ModuleList
    computed: list[tuple[PagedKVCache, Tensor, Tensor]] = field(default_factory=list)
    masks: dict[int | None, Tensor] = field(default_factory=dict)

    def mask(self, window: int | None) -> Tensor:
        """The mask of this step for a sliding ``window`` (None: full attention), made once."""
        if window not in self.masks:
            self.masks[window] = window_mask(self.start, self.pos, self.past_keys, window)
        return self.masks[window]


def window_mask(start: Tensor, pos: Tensor, past_keys: int, window: int | None) -> Tensor:
    """The mask over a row's past keys then its own chunk's: start [R], pos [R, S] ->
    [R, 1, S, past_keys + S] (bool). A past key j is seen when j < start and (with a window W)
    j > pos - W, as transformers' sliding-window mask; the chunk's key s' when s' <= s (and
    s' > s - W)."""
    r, s = pos.shape
    j = torch.arange(past_keys, device=pos.device)[None, None, :]  # [1, 1, P]
    past = (j < start[:, None, None]).expand(r, s, past_keys)  # [R, S, P]
    steps = torch.arange(s, device=pos.device)
    own = steps[None, :] <= steps[:, None]  # [S, S]
    if window is not None:
        past = past & (j > pos[:, :, None] - window)
        own = own & (steps[None, :] > steps[:, None] - window)
    return torch.cat([past, own[None].expand(r, s, s)], dim=-1)[:, None]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    *,
    scaling: float | None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """Grouped-query attention without repeating K/V: q [R, Hq, S, Dk], k [R, Hkv, L, Dk],
    v [R, Hkv, L, Dv], mask [R, 1, S, L] -> [R, Hq, S, Dv]. Query head i reads KV head
    i // (Hq / Hkv), as transformers' ``repeat_kv``. ``softcap``: logits -> tanh(l / c) * c
    before the mask; ``sinks`` [Hq]: one more logit per head in the softmax, dropped after."""
    r, hq, s, d = q.shape
    hkv, keys, dv = k.shape[1], k.shape[2], v.shape[-1]
    rep = hq // hkv
    qf = q.reshape(r, hkv, rep * s, d)  # [R, Hkv, rep * S, Dk]
    mf = mask[:, :, None].expand(r, 1, rep, s, keys).reshape(r, 1, rep * s, keys)
    if softcap is None and sinks is None:
        y = F.scaled_dot_product_attention(qf, k, v, attn_mask=mf, scale=scaling)
        return y.reshape(r, hq, s, dv)
    scale = d**-0.5 if scaling is None else scaling
    logits = torch.matmul(qf, k.transpose(-1, -2)) * scale  # [R, Hkv, rep * S, L]
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits.masked_fill(~mf, float("-inf"))
    if sinks is not None:  # [Hq] -> one column per (KV head, query head, token)
        sink = sinks.to(logits.dtype).reshape(1, hkv, rep, 1).expand(r, hkv, rep, s)
        logits = torch.cat([logits, sink.reshape(r, hkv, rep * s, 1)], dim=-1)
        logits = logits - logits.amax(dim=-1, keepdim=True)
        probs = torch.softmax(logits.float(), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits.float(), dim=-1)
    y = torch.matmul(probs.to(v.dtype), v)  # [R, Hkv, rep * S, Dv]
    return y.reshape(r, hq, s, dv)


def paged_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    paged: PagedStep | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """transformers' attention call over our pools -> (out [B, S, Hq, Dv], None).

    query [B, Hq, S, Dk], key [B, Hkv, S, Dk], value [B, Hkv, S, Dv] (B = R, or 1 for a packed
    step: its N real tokens)."""
    if paged is None:
        raise ConfigError(
            f"the {PAGED_ATTENTION!r} attention runs inside a paged step only "
            "(models/hf_model.PagedHFModel.paged_step passes its state as `paged=`)"
        )
    layer: int = getattr(module, "layer_idx")  # noqa: B009  (transformers' attention modules)
    pool: PagedKVCache = paged.pools[layer]  # type: ignore[assignment]
    slots = paged.slots
    live = slots.live
    paged.computed.append((pool, key, value))
    decode = live is None and query.shape[2] == 1
    if pool.cpu_decode and decode and softcap is None and s_aux is None:
        # a decode step: the CPU op reads the pools in place (no gathered past, no concat)
        k, v = key.to(pool.k_pool.dtype), value.to(pool.v_pool.dtype)
        mask = paged.mask(sliding_window)  # [R, 1, 1, NBp * bs + 1]
        y = decode_attention(query, pool.k_pool, pool.v_pool, slots.past, k, v, mask, scaling)
        return y.transpose(1, 2), None  # [R, 1, Hq, D]
    past_k, past_v = pool.gather(slots.past)  # [R, Hkv, NBp * bs, D]
    q, k, v = query, key, value
    if live is not None:  # [1, H, N, D] -> [R, H, S, D]
        r, s = paged.pos.shape
        q, k, v = (unpack_rows(t.transpose(1, 2), live, r, s).transpose(1, 2) for t in (q, k, v))
    keys = torch.cat([past_k, k.to(past_k.dtype)], dim=2)  # [R, Hkv, NBp * bs + S, Dk]
    values = torch.cat([past_v, v.to(past_v.dtype)], dim=2)
    sinks = s_aux
    y = attend(
        q, keys, values, paged.mask(sliding_window), scaling=scaling, softcap=softcap, sinks=sinks
    )  # [R, Hq, S, Dv]
    y = y.transpose(1, 2)  # [R, S, Hq, Dv]
    if live is not None:
        y = pack_rows(y, live)  # [1, N, Hq, Dv]
    return y, None


def register_paged_attention() -> None:
    """Register :func:`paged_attention_forward` in transformers' ``AttentionInterface`` (once;
    no mask function: transformers then builds no mask for it)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PAGED_ATTENTION, paged_attention_forward)
