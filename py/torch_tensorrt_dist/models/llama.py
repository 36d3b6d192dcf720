"""A compact Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3) with a paged or a static KV
cache.

RMSNorm, RoPE in Hugging Face's ``rotate_half`` layout (so HF q/k weights load without a
permutation; Llama-3 frequency scaling included), grouped-query attention, SwiGLU MLP, optional
q/k/v bias, Qwen3's per-head q/k RMSNorm before RoPE (``QKNormLinear``), tied or untied
embeddings. Tensor parallelism (``parallel/llama.py``) shards the
linears by hand and sets the per-rank head counts and the TP group on the modules; the forward
then issues exactly two all-reduces per layer (attention output, MLP down projection); outside the
layers, a vocabulary-parallel embedding adds one all-reduce of the embedded tokens and a
vocabulary-parallel LM head one all-gather of the logits.

    model = Transformer(ModelArgs.from_name("tiny"))
    model.setup_caches(max_batch_size=1, max_seq_len=64)
    logits = model(tokens, cache_pos)          # tokens: [B, S], cache_pos: [S] -> [B, S, V]

``cache_pos`` holds the KV-cache slots of the S tokens (the same for every row); ``pad`` ([B])
says how many leading slots of each row are left padding: they are masked out and positions
(RoPE) start at 0 after them. Everything is a tensor, so decode steps never recompile.

The generation core (``generation/core.py``) runs the paged form (``models/paged_steps.py``):
``setup_paged`` gives every layer a pool of KV blocks, and ``paged_step(tokens [R, S], start
[R], last [R], past [R, NB], dest [R, S])`` runs R rows, each a decode token or a prompt chunk
over its own blocks, and returns the logits of each row's last token (``every``: of every
token). A pipeline stage is this model with only its parts (``models/stage.py``): its paged
step takes and gives hidden states at its boundaries. The static form above is what the
quantization bench runs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama_args import PRESETS, ModelArgs, RopeScaling
from torch_tensorrt_dist.models.paged import (
    PagedKVCache,
    PagedSlots,
    pack_rows,
    paged_attention,
    unpack_rows,
)
from torch_tensorrt_dist.models.paged_steps import PagedSteps
from torch_tensorrt_dist.models.rope import (
    apply_rope,
    apply_rope_flipped,
    rope_inv_freq,
    rope_tables,
)
from torch_tensorrt_dist.models.stage import StageRole
from torch_tensorrt_dist.models.vocab import VocabEmbedding, embed_tokens, lm_logits
from torch_tensorrt_dist.ops.cpu_attention import decode_attention

__all__ = [
    "PRESETS",
    "Attention",
    "FeedForward",
    "KVCache",
    "ModelArgs",
    "QKNormLinear",
    "RMSNorm",
    "RopeScaling",
    "Transformer",
    "TransformerBlock",
    "VocabEmbedding",
    "apply_rope",
    "embed_tokens",
    "lm_logits",
    "rope_inv_freq",
    "rope_tables",
]


def _all_reduce(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    # One plain functional collective: traced as _c10d_functional.all_reduce + wait_tensor.
    return x if group is None else funcol.all_reduce(x, "sum", group)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class QKNormLinear(nn.Linear):
    """A q or k projection followed by RMSNorm over each head's ``head_dim`` values (Qwen3).

    A ``nn.Linear`` subclass, so the tensor-parallel plan slices its weight rows (whole heads)
    as it slices ``wq``/``wk``; the norm's weight is per head dim and stays replicated.
    """

    def __init__(self, dim: int, out: int, head_dim: int, bias: bool, eps: float) -> None:
        super().__init__(dim, out, bias=bias)
        self.head_dim = head_dim
        self.norm = RMSNorm(head_dim, eps)

    def forward(self, x: Tensor) -> Tensor:
        y = super().forward(x)  # [..., H * D]
        return self.norm(y.unflatten(-1, (-1, self.head_dim))).flatten(-2)


def _qk_linear(args: ModelArgs, heads: int) -> nn.Linear:
    """The q (``heads``: n_heads) or k (n_kv_heads) projection, normed per head where
    ``args.qk_norm``."""
    d = args.head_dim
    if args.qk_norm:
        return QKNormLinear(args.dim, heads * d, d, args.qkv_bias, args.norm_eps)
    return nn.Linear(args.dim, heads * d, bias=args.qkv_bias)


class KVCache(nn.Module):
    """Static cache of the (local) KV heads: k_cache, v_cache: [B, H_kv, L, D]."""

    k_cache: Tensor
    v_cache: Tensor

    def __init__(
        self,
        max_batch_size: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        shape = (max_batch_size, n_kv_heads, max_seq_len, head_dim)
        self.register_buffer(
            "k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer(
            "v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False
        )

    def update(self, cache_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # cache_pos: [S]; k, v: [B, H_kv, S, D] -> full caches [B, H_kv, L, D]
        b = k.shape[0]
        if b == self.k_cache.shape[0]:
            # Every row at once, straight into the buffers: the captured graph is
            # index_copy(<cache placeholder>, 2, cache_pos, k), which engines do in place
            # (the Generator pads requests to max_batch_size rows for this).
            self.k_cache.index_copy_(2, cache_pos, k)
            self.v_cache.index_copy_(2, cache_pos, v)
            return self.k_cache, self.v_cache
        # Fewer rows: a write through a view (slice -> index_copy -> slice_scatter once
        # captured), which copies the whole cache back on every call. Correct, but slow.
        self.k_cache[:b].index_copy_(2, cache_pos, k)
        self.v_cache[:b].index_copy_(2, cache_pos, v)
        return self.k_cache[:b], self.v_cache[:b]


class Attention(nn.Module):
    wqk: Tensor | None

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        d = args.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, d
        self.qk_norm = args.qk_norm
        self.wq = _qk_linear(args, args.n_heads)
        self.wk = _qk_linear(args, args.n_kv_heads)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * d, bias=args.qkv_bias)
        self.wo = nn.Linear(args.n_heads * d, args.dim, bias=False)
        # Added once, after the all-reduce (a row-parallel bias must not be summed tp times).
        self.wo_bias = nn.Parameter(torch.zeros(args.dim)) if args.o_bias else None
        self.register_buffer("wqk", None, persistent=False)  # wq's, wk's weights: fuse_qk
        self.kv_cache: KVCache | None = None
        self.kv_pages: PagedKVCache | None = None  # set by Transformer.setup_paged
        self.group: dist.ProcessGroup | None = None  # TP group; set by parallel.llama.apply_tp

    def fuse_qk(self) -> None:
        """Qwen3's q and k projections as one matrix (``wqk``, a buffer in no state dict; wq's
        and wk's weights become views of it), where both are plain float32 ``QKNormLinear``s
        without bias; ``weight_layout.lay_out_linears`` calls it where it keeps float32 rows
        (the Inductor engine). One product fewer a layer; Inductor fuses the heads' norms
        with the RoPE (else, rows a dynamic size, two kernels a layer: 26 in an 8-row step)."""
        wq, wk = self.wq, self.wk
        ok = type(wq) is type(wk) is QKNormLinear and wq.bias is None  # (qkv_bias: both)
        ok = ok and type(wq.weight.data) is torch.Tensor and wq.weight.dtype == torch.float32
        if self.wqk is not None or not ok:
            return
        w, n = torch.cat([wq.weight.detach(), wk.weight.detach()]), wq.weight.shape[0]
        wq.weight = nn.Parameter(w[:n], requires_grad=False)
        wk.weight = nn.Parameter(w[n:], requires_grad=False)
        self._buffers["wqk"] = nn.Parameter(w, requires_grad=False)  # (row_products.py)

    def _qk(self, x: Tensor) -> tuple[Tensor, Tensor]:
        # x: [B, S, dim] -> q [B, Hq, S, D], k [B, Hkv, S, D] (normed per head where qk_norm)
        b, s, _ = x.shape
        if self.wqk is None or type(self.wq) is not QKNormLinear:  # (quantized after fuse_qk)
            q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
            k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim)
        else:
            y = F.linear(x, self.wqk).unflatten(-1, (-1, self.head_dim))  # [B, S, Hq + Hkv, D]
            q = self.wq.get_submodule("norm")(y[:, :, : self.n_heads])
            k = self.wk.get_submodule("norm")(y[:, :, self.n_heads :])
        return q.transpose(1, 2), k.transpose(1, 2)

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x: [B, S, dim] -> q [B, Hq, S, D], k, v [B, Hkv, S, D] (RoPE applied to q and k)
        b, s, _ = x.shape
        q, k = self._qk(x)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        rope = apply_rope_flipped if self.qk_norm else apply_rope  # (rope.py says why)
        return rope(q, cos, sin), rope(k, cos, sin), v

    def _out(self, y: Tensor) -> Tensor:
        # y: [B, Hq, S, D] -> [B, S, dim], summed over the TP group
        b, _, s, _ = y.shape
        y = self.wo(y.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))
        y = _all_reduce(y, self.group)  # 1st all-reduce of the layer
        return y if self.wo_bias is None else y + self.wo_bias

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, where: Tensor | PagedSlots
    ) -> Tensor:
        # x: [B, S, dim]; cos/sin: [B, S, D]; mask: [B, 1, S, L] (bool). ``where``: the static
        # cache's slots cache_pos [S] (the same for every row), or a paged step's slots
        # (``models/paged.py``: each token's block and offset, the rows' block tables)
        q, k, v = self._qkv(x, cos, sin)  # [B, Hq, S, D], [B, Hkv, S, D]
        if isinstance(where, PagedSlots):
            return self._out(self._paged(q, k, v, mask, where))
        if self.kv_cache is None:
            raise ConfigError("call Transformer.setup_caches(...) before running the model")
        k, v = self.kv_cache.update(where, k, v)  # [B, Hkv, L, D]
        rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(rep, dim=1)  # [B, Hq, L, D]
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, Hq, S, D]
        return self._out(y)

    def _paged(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, slots: PagedSlots) -> Tensor:
        # q: [R, Hq, S, D]; k, v: [R, Hkv, S, D] (this step's); mask: [R, 1, S, NBp * bs + S]
        # -> [R, Hq, S, D]. The step's own K/V join the gathered past; they are written to
        # the pools after the last layer (Transformer.paged_step). A packed step
        # (``slots.live``): q, k, v and the result [1, H, N, D], attention over [R, S]
        if self.kv_pages is None:
            raise ConfigError("call Transformer.setup_paged(...) before running a paged step")
        live, pages = slots.live, self.kv_pages
        slots.computed.append((k, v))
        if live is not None:  # [1, H, N, D] -> [R, H, S, D]
            r, s = slots.past.shape[0], mask.shape[2]
            q, k, v = (
                unpack_rows(t.transpose(1, 2), live, r, s).transpose(1, 2) for t in (q, k, v)
            )
        if pages.cpu_decode and (slots.few or q.shape[2] == 1):
            # a decode step, or a verify call's few tokens a row: the CPU op reads the pools
            # in place (no gathered past, no concatenated keys)
            y = decode_attention(q, pages.k_pool, pages.v_pool, slots.past, k, v, mask)
        else:
            past_k, past_v = pages.gather(slots.past)  # [R, Hkv, NBp * bs, D]
            keys = torch.cat([past_k, k], dim=2)  # [R, Hkv, NBp * bs + S, D]
            values = torch.cat([past_v, v], dim=2)
            y = paged_attention(q, keys, values, mask)
        return y if live is None else pack_rows(y.transpose(1, 2), live).transpose(1, 2)


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.intermediate_size, bias=False)  # gate
        self.w3 = nn.Linear(args.dim, args.intermediate_size, bias=False)  # up
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False)  # down
        self.group: dist.ProcessGroup | None = None

    def forward(self, x: Tensor) -> Tensor:
        y = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return _all_reduce(y, self.group)  # 2nd all-reduce of the layer


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, where: Tensor | PagedSlots
    ) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, where)
        return h + self.feed_forward(self.ffn_norm(h))


def mask_and_positions(
    args: ModelArgs, key_slots: Tensor, cache_pos: Tensor, pad: Tensor
) -> tuple[Tensor, Tensor]:
    """Attention mask and RoPE positions for left-padded rows writing KV slots ``cache_pos``.

    key_slots: [L] (arange), cache_pos: [S], pad: [B] -> mask [B, 1, S, L] (bool), positions
    [B, S]. A query sees the slots up to its own, minus the row's padding (and the window).
    """
    j = key_slots  # [L]
    q = cache_pos[:, None]  # [S, 1]
    visible = (j[None, None, :] >= pad[:, None, None]) | (j == q)[None]  # [B, S, L]
    mask = (j <= q)[None] & visible
    if args.sliding_window is not None:
        mask = mask & (j > q - args.sliding_window)[None]
    positions = (cache_pos[None, :] - pad[:, None]).clamp(min=0)  # [B, S]
    return mask[:, None], positions


class Transformer(PagedSteps, nn.Module):
    rope_cos: Tensor  # [L, D] float32, set by setup_caches
    rope_sin: Tensor
    key_slots: Tensor  # [L]: arange(L)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = VocabEmbedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # Tied: the head reads tok_embeddings.weight (or its own vocab shard, under TP).
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, False)
        self.group: dist.ProcessGroup | None = None  # set when the LM head is vocab-parallel
        self.max_batch_size = -1
        self.max_seq_len = -1
        self.block_size = -1  # set by setup_paged
        self.paged_version = 0  # raised by each setup_paged
        self.bytes_read = 0  # checkpoint bytes this rank read (set by the loaders)
        #: the part of the decoder this rank runs (``models/stage.cut_stage``): all of it
        self.stage = StageRole.whole(args.n_layers)

    def setup_caches(
        self, max_batch_size: int, max_seq_len: int, *, dtype: torch.dtype | None = None
    ) -> None:
        """Allocate the KV caches and RoPE tables for ``max_batch_size`` x ``max_seq_len``."""
        if max_seq_len > self.args.max_seq_len:
            raise ConfigError(
                f"max_seq_len={max_seq_len} exceeds the model's limit {self.args.max_seq_len} "
                "(max_position_embeddings); ask for fewer tokens"
            )
        weight = self._model_weight()  # the model dtype (a quantized embedding holds int8)
        dtype = dtype or weight.dtype
        for block in self.blocks:
            attn = block.attention
            attn.kv_cache = KVCache(
                max_batch_size, attn.n_kv_heads, max_seq_len, attn.head_dim, dtype, weight.device
            )
        cos, sin = rope_tables(self.args, max_seq_len)
        self.register_buffer("rope_cos", cos.to(weight.device), persistent=False)
        self.register_buffer("rope_sin", sin.to(weight.device), persistent=False)
        self.register_buffer(
            "key_slots", torch.arange(max_seq_len, device=weight.device), persistent=False
        )
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len

    @property
    def blocks(self) -> list[TransformerBlock]:
        """The decoder layers this rank holds (all of them, unless it is a pipeline stage)."""
        return [layer for layer in self.layers if isinstance(layer, TransformerBlock)]

    def _model_weight(self) -> Tensor:
        # a weight every stage holds, never quantized: the model's dtype and device
        return self.blocks[0].attention_norm.weight

    def forward(
        self,
        tokens: Tensor,
        cache_pos: Tensor,
        pad: Tensor | None = None,
        *,
        last_only: bool = False,
    ) -> Tensor:
        # tokens: [B, S] int64; cache_pos: [S] int64; pad: [B] int64 -> logits [B, S|1, V]
        self._check_caches()
        if pad is None:
            pad = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
        mask, positions = mask_and_positions(self.args, self.key_slots, cache_pos, pad)
        x = self.tok_embeddings(tokens)  # [B, S, dim]
        cos = self.rope_cos[positions].to(x.dtype)  # [B, S, D]
        sin = self.rope_sin[positions].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache_pos)
        if last_only:
            x = x[:, -1:]
        return self._logits(x)

    def _check_caches(self) -> None:
        if self.max_seq_len < 0:
            raise ConfigError("call Transformer.setup_caches(...) before running the model")

    def _logits(self, x: Tensor) -> Tensor:
        # x: [B, S, dim] -> [B, S, V]: final norm and the (tied or own, maybe sharded) head
        head = self.tok_embeddings if self.output is None else self.output
        scales = getattr(head, "scales", None)  # quantized (--quantize-embeddings): int8 rows
        return lm_logits(self.norm(x), head.weight, self.group, self.args.vocab_size, scales=scales)
