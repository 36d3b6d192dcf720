"""Paged KV cache and the attention that reads it: a step costs the rows and tokens it holds.

    model.setup_paged(num_blocks=256, block_size=16, max_seq_len=2048)
    logits = model.paged_step(tokens, start, last, past, dest)
    # tokens [R, S], start [R], last [R], past [R, NBp], dest [R, S] -> logits [R, V]

Each layer's cache is a pool of fixed-size blocks, ``k_pool``/``v_pool``: [N, bs, H_kv, D].
A sequence owns a list of blocks (its block table); its token at position p lives in block
``table[p // bs]`` at offset ``p % bs``. Block 0 is the null block: no sequence owns it, the
padding of a step writes there, and tables are padded with it (always masked).

One step runs R rows of S tokens each: row r's tokens sit at positions ``start[r] + s``, the
first ``last[r] + 1`` of them real (a decode row: S = 1; a prefill chunk: the chunk,
right-padded to the longest of the step). Each row attends over two parts:

* its past, the K/V of positions ``< start[r]``, gathered from its blocks ``past[r]`` (NBp of
  them: the longest past of the step, at least 2, padded with the null block; masked beyond
  ``start[r]``), and
* its own chunk's K/V, computed in this step (causal within the chunk),

with grouped-query heads folded into the query length (``[R, H_kv, rep * S, D]``), so K/V are
never repeated per query head, and the sliding window applied to both parts. The chunk's K/V
are written into the pools only after the last layer (``dest[r, s]``: the block of each token,
the null block for padding; the offset is its position modulo the block size): every write is
an ``index_put`` into a pool, in place, at the end of the step, so everything before it (every
layer, the logits) is one piece of computation that never reads what it writes (one TensorRT
engine; the writes are a tail that stays in PyTorch: ``conversion/layers/paged_kv.py``).

R, S and NBp are dynamic dimensions: a step's cost follows the live rows and their lengths,
never the reserved pool.
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
    "StepArgs",
    "pack_rows",
    "paged_attention",
    "paged_mask",
    "paged_slots",
    "unpack_rows",
]

#: The block no sequence owns: padding writes land there and padded tables point at it.
NULL_BLOCK = 0


class PagedKVCache(nn.Module):
    """One layer's K/V block pools: k_pool [N, bs, H_kv, D], v_pool [N, bs, H_kv, Dv] (``v_dim``:
    a value head size of its own, as in multi-head latent attention; default D)."""

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
        *,
        v_dim: int | None = None,
    ) -> None:
        super().__init__()
        #: decode steps read the pools in place through the CPU op (``ops/cpu_attention.py``)
        self.cpu_decode = False
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        v_shape = (*shape[:3], head_dim if v_dim is None else v_dim)
        self.register_buffer("k_pool", torch.zeros(shape, dtype=dtype, device=device), False)
        self.register_buffer("v_pool", torch.zeros(v_shape, dtype=dtype, device=device), False)

    def forward(self, blk: Tensor, off: Tensor, k: Tensor, v: Tensor) -> None:
        """Write T tokens' K/V. blk, off: [T]; k [T, H_kv, D], v [T, H_kv, Dv]. Captured:
        index_put(<pool placeholder>, [blk, off], k), done in place by every engine
        (lowering/input_writes.py, conversion/layers/paged_kv.py)."""
        self.k_pool[blk, off] = k
        self.v_pool[blk, off] = v

    def gather(self, table: Tensor) -> tuple[Tensor, Tensor]:
        # table: [R, NB] -> k [R, H_kv, NB * bs, D], v [R, H_kv, NB * bs, Dv] (in order)
        r, nb = table.shape
        _, bs, h, d = self.k_pool.shape
        k = self.k_pool[table].reshape(r, nb * bs, h, d).transpose(1, 2)
        v = self.v_pool[table].reshape(r, nb * bs, h, self.v_pool.shape[-1]).transpose(1, 2)
        return k, v


class StepArgs(NamedTuple):
    """The inputs of one paged step, in the order every step function takes them
    (``Transformer.paged_step(*args)``, ``PagedHFModel.paged_step``, a compiled step)."""

    tokens: Tensor
    """[R, S]: a decode row's last token (S = 1), a prefill chunk right-padded; a pipeline
    stage after the first: the previous stage's hidden states [R, S, dim]."""
    start: Tensor
    """[R]: the row's tokens already in its blocks (the position of ``tokens[:, 0]``)."""
    last: Tensor
    """[R]: the index of the row's last real token."""
    past: Tensor
    """[R, NBp]: the blocks that hold positions < start, padded with the null block."""
    dest: Tensor
    """[R, S]: each token's block, the null block for padding."""
    live: Tensor | None = None
    """[N]: a packed step's real tokens (:func:`pack_rows`); None unpacked."""


class PagedSlots(NamedTuple):
    """A step's KV bookkeeping: where each token's K/V goes (block and offset, [R * S] each),
    the rows' past blocks [R, NBp], and the K/V each layer computed (appended by the layers,
    written by ``Transformer.paged_step`` after the last one)."""

    blocks: Tensor
    offsets: Tensor
    past: Tensor
    computed: list[tuple[Tensor, Tensor]]
    #: a packed step's real tokens (``R * S`` flat indices, :func:`pack_rows`), else None
    live: Tensor | None = None
    #: a few tokens a row (a verify call, S = k + 1 <= 17): layers whose pools say
    #: ``cpu_decode`` attend through the CPU op over the pools, as decode steps do
    few: bool = False


def paged_slots(step: StepArgs, block_size: int, *, few: bool = False) -> tuple[Tensor, PagedSlots]:
    """Positions and KV slots of a step's tokens -> positions [R, S] (RoPE and mask) and the
    slots: padding tokens (s > last) take their row's last position (a short row's padding
    would otherwise run past the RoPE table near the longest sequence) and write into the null
    block, whatever ``dest`` says; offsets are positions modulo the block size; ``few``: the
    slots' flag of that name. (Combining
    ``dest`` with ``last`` also tells the compiler that both have R rows: the block and offset
    of a write are one length.) ``live`` (a packed step, :func:`pack_rows`): the slots of
    the real tokens only, [N] each, in the packed order.
    """
    start, last, past, dest, live = step.start, step.last, step.past, step.dest, step.live
    s = dest.shape[1]
    steps = torch.arange(s, device=start.device)
    real = steps[None, :] <= last[:, None]  # [R, S]
    pos = start[:, None] + torch.minimum(steps[None, :], last[:, None])  # [R, S]
    blk = torch.where(real, dest, NULL_BLOCK)
    off = pos % block_size
    blk, off = blk.reshape(-1), off.reshape(-1)
    if live is not None:
        blk, off = blk[live], off[live]
    return pos, PagedSlots(blk, off, past, [], live, few)


def pack_rows(x: Tensor, live: Tensor) -> Tensor:
    """A padded step's rows packed: x [R, S, ...] -> [1, N, ...], the real tokens only.

    A step of several rows of different lengths (prefill chunks, or a chunk beside decoding
    rows) is right-padded to its longest row, R x S tokens; ``live`` [N] holds the flat index
    ``r * S + s`` of each real token, row by row. The products (every linear layer, most of a
    step) run over the N packed tokens; attention unpacks to [R, S] (:func:`unpack_rows`),
    where the mask already keeps padding out of every real token's keys.
    """
    return x.flatten(0, 1)[live][None]


def unpack_rows(x: Tensor, live: Tensor, rows: int, tokens: int) -> Tensor:
    """:func:`pack_rows` undone: x [1, N, ...] -> [R, S, ...], padding zero."""
    flat = x.new_zeros((rows * tokens, *x.shape[2:]))
    return flat.index_copy(0, live, x[0]).unflatten(0, (rows, tokens))


def paged_mask(args: ModelArgs, start: Tensor, pos: Tensor, past_keys: int) -> Tensor:
    """The mask over a row's past keys then its own chunk's: start [R], pos [R, S] (query
    positions), ``past_keys`` = NBp * bs -> [R, 1, S, past_keys + S] (bool).

    A past key at position j is seen when j < start (it is computed) and, with a sliding
    window W, j > pos - W; the chunk's key s' when s' <= s (and s' > s - W). Padding queries
    (s > last) see what their position allows: their outputs are never used.
    """
    s = pos.shape[1]
    j = torch.arange(past_keys, device=pos.device)[None, None, :]  # [1, 1, P]
    q = pos[:, :, None]  # [R, S, 1]
    past = j < start[:, None, None]  # [R, 1, P]
    steps = torch.arange(s, device=pos.device)
    own = steps[None, :] <= steps[:, None]  # [S, S]: key s' <= query s
    if args.sliding_window is not None:
        w = args.sliding_window
        past = past & (j > q - w)  # [R, S, P]
        own = own & (steps[None, :] > steps[:, None] - w)
    r = pos.shape[0]
    past = past.expand(r, s, past_keys)
    return torch.cat([past, own[None].expand(r, s, s)], dim=-1)[:, None]


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
