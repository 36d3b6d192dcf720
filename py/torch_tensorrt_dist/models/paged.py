"""Paged KV cache and the attention that reads it: a step costs the rows and tokens it holds.

    model.setup_paged(num_blocks=256, block_size=16, max_seq_len=2048)
    logits = model.paged_step(tokens, start, last, table)   # [R, S], [R], [R], [R, NB] -> [R, V]

Each layer's cache is a pool of fixed-size blocks, ``k_pool``/``v_pool``: [N, bs, H_kv, D].
A sequence owns a list of blocks (its block table); its token at position p lives in block
``table[p // bs]`` at offset ``p % bs``. Block 0 is the null block: no sequence owns it, the
padding of a step writes there, and a table is padded with it (always masked).

One step runs R rows of S tokens each: row r's tokens sit at positions ``start[r] + s``, the
first ``last[r] + 1`` of them real (a decode row: S = 1; a prefill chunk: the chunk,
right-padded to the longest of the step). The step writes each real token's K/V into its block
(an ``index_put`` into the pool, in place), gathers each row's blocks (NB of them: the longest
row of the step) and attends over them with a mask (key position <= query position, within the
sliding window). Grouped-query attention folds the query heads of one KV head into the query
length (``[R, H_kv, rep * S, D]``), so K/V are never repeated per query head. R, S and NB are
dynamic dimensions: a step's cost follows the live rows and their lengths, not the reserved
pool.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torch_tensorrt_dist.models.llama_args import ModelArgs

__all__ = [
    "NULL_BLOCK",
    "PagedKVCache",
    "PagedSlots",
    "paged_attention",
    "paged_mask",
    "paged_slots",
]

#: The block no sequence owns: padding writes land there and padded tables point at it.
NULL_BLOCK = 0


class PagedKVCache(nn.Module):
    """One layer's K/V block pools: k_pool, v_pool: [N, bs, H_kv, D]."""

    k_pool: Tensor
    v_pool: Tensor

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.register_buffer("k_pool", torch.zeros(shape, dtype=dtype, device=device), False)
        self.register_buffer("v_pool", torch.zeros(shape, dtype=dtype, device=device), False)

    @property
    def block_size(self) -> int:
        return self.k_pool.shape[1]

    def write(self, blk: Tensor, off: Tensor, k: Tensor, v: Tensor) -> None:
        # blk, off: [T]; k, v: [T, H_kv, D]. Captured: index_put(<pool placeholder>, [blk, off],
        # k), done in place on the pool by every engine (lowering/input_writes.py).
        self.k_pool[blk, off] = k
        self.v_pool[blk, off] = v

    def gather(self, table: Tensor) -> tuple[Tensor, Tensor]:
        # table: [R, NB] -> k, v: [R, H_kv, NB * bs, D] (the rows' blocks, in order)
        r, nb = table.shape
        _, bs, h, d = self.k_pool.shape
        k = self.k_pool[table].reshape(r, nb * bs, h, d).transpose(1, 2)
        v = self.v_pool[table].reshape(r, nb * bs, h, d).transpose(1, 2)
        return k, v


class PagedSlots(NamedTuple):
    """Where a step's tokens go: block and offset of each token's K/V ([R * S] each), and the
    rows' block tables [R, NB] that attention reads."""

    blocks: Tensor
    offsets: Tensor
    table: Tensor


def paged_slots(
    start: Tensor, last: Tensor, table: Tensor, s: int, block_size: int
) -> tuple[Tensor, PagedSlots]:
    """Positions and KV slots of a step's tokens.

    start, last: [R]; table: [R, NB] -> positions [R, S] (RoPE and mask) and the slots; padding
    tokens (s > last[r]) write into the null block.
    """
    steps = torch.arange(s, device=start.device)  # [S]
    pos = start[:, None] + steps[None, :]  # [R, S]
    real = steps[None, :] <= last[:, None]  # [R, S]
    col = torch.where(real, pos // block_size, 0).clamp(max=table.shape[1] - 1)
    blk = torch.where(real, table.gather(1, col), NULL_BLOCK)
    off = pos % block_size
    return pos, PagedSlots(blk.reshape(-1), off.reshape(-1), table)


def paged_mask(args: ModelArgs, pos: Tensor, keys: int) -> Tensor:
    """pos: [R, S] query positions, ``keys`` = NB * bs -> mask [R, 1, S, keys] (bool): a query
    sees the keys at positions up to its own (within the sliding window). Keys past a row's
    length (later blocks of its table, the null block) are never seen."""
    j = torch.arange(keys, device=pos.device)[None, None, :]  # [1, 1, L]
    q = pos[:, :, None]  # [R, S, 1]
    mask = j <= q
    if args.sliding_window is not None:
        mask = mask & (j > q - args.sliding_window)
    return mask[:, None]


def paged_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Grouped-query attention without repeating K/V.

    q: [R, Hq, S, D]; k, v: [R, H_kv, L, D]; mask: [R, 1, S, L] -> [R, Hq, S, D]. The rep =
    Hq / H_kv query heads of a KV head become rep * S queries of that head (query head i uses
    KV head i // rep, as ``repeat_interleave`` would give it).
    """
    r, hq, s, d = q.shape
    hkv, keys = k.shape[1], k.shape[2]
    rep = hq // hkv
    qf = q.reshape(r, hkv, rep * s, d)  # [R, Hkv, rep * S, D]
    mf = mask[:, :, None].expand(r, 1, rep, s, keys).reshape(r, 1, rep * s, keys)
    y = F.scaled_dot_product_attention(qf, k, v, attn_mask=mf)  # [R, Hkv, rep * S, D]
    return y.reshape(r, hq, s, d)
