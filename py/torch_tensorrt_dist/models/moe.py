"""Mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE) on the Llama-family model code.

``MoETransformer`` is ``models/llama.Transformer`` with the MLP of its sparse layers replaced by
:class:`SparseMoE`: a replicated router (softmax, top-k, optional renormalisation), the routed
SwiGLU experts stacked into three tensors, and Qwen2-MoE's shared expert with its sigmoid gate.
Attention, norms, KV cache, embedding and LM head are the Llama ones, so ``Generator``,
``explain`` and the tensor-parallel plan work unchanged.

Static shapes and exact results: each rank computes its experts (``expert_start`` onwards) for
the tokens routed to them only: the ``T x k`` (token, choice) rows are sorted by expert and
multiplied by one grouped matmul per projection (``ops/experts.py``, "grouped"); in a compiled
graph where tokens x top_k is at most the local expert count (decode) it gathers each token's k
experts' weights by index instead ("routed", which Inductor fuses into one kernel). "dense"
(every local expert for every token, zero weight where not routed) stays as the reference. No
token is ever dropped, no shape depends on the routing, and prefill and decode stay one graph
each.
Under expert x tensor parallelism (``parallel/moe.py``) the partial sums of all ranks meet
in ONE all-reduce over the EP x TP group (``group``); the docs (``docs/moe.md``) say why this
beats an all-to-all dispatch for batch-1 decode.

    model = MoETransformer(args, moe)
    model.setup_caches(max_batch_size=1, max_seq_len=64)
    logits = model(tokens, cache_pos)          # tokens: [B, S] -> [B, S, V]
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.ops.experts import moe_experts

__all__ = [
    "COMPUTE_MODES",
    "MoETransformer",
    "SharedExpert",
    "SparseMoE",
    "route",
    "top_k_routing",
]

#: the expert compute forms of :class:`SparseMoE` (``compute``; "auto" picks one per graph)
COMPUTE_MODES = ("grouped", "routed", "dense")


def top_k_routing(logits: Tensor, top_k: int, norm_topk_prob: bool) -> tuple[Tensor, Tensor]:
    """logits: [T, E] -> (weights [T, k] float32, expert ids [T, k]): softmax in float32, top-k,
    optional renormalisation, as transformers' Mixtral/Qwen2-MoE routers do."""
    probs = F.softmax(logits.float(), dim=-1)  # [T, E]
    top_w, top_i = torch.topk(probs, top_k, dim=-1)  # [T, k]
    if norm_topk_prob:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    return top_w, top_i


def route(logits: Tensor, top_k: int, norm_topk_prob: bool, start: int, count: int) -> Tensor:
    """Routing weights of experts ``[start, start + count)`` for every token (0 if not routed).

    logits: [T, E] router logits -> [T, count] float32. Each token has at most one non-zero
    term per expert in the sum over its k choices, so the weights are exact.
    """
    top_w, top_i = top_k_routing(logits, top_k, norm_topk_prob)
    ids = torch.arange(count, device=logits.device) + start  # [count]
    hit = top_i[..., None] == ids  # [T, k, count]
    return (top_w[..., None] * hit).sum(dim=1)  # [T, count]


class SharedExpert(nn.Module):
    """Qwen2-MoE's shared expert: a SwiGLU every token goes through, times a sigmoid gate."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)  # gate_proj
        self.w3 = nn.Linear(dim, hidden, bias=False)  # up_proj
        self.w2 = nn.Linear(hidden, dim, bias=False)  # down_proj
        self.gate = nn.Linear(dim, 1, bias=False)  # shared_expert_gate (replicated)

    def forward(self, h: Tensor) -> Tensor:
        # h: [T, D] -> [T, D] (a partial sum when w1/w3/w2 are sharded)
        y = self.w2(F.silu(self.w1(h)) * self.w3(h))
        return torch.sigmoid(self.gate(h)) * y


class SparseMoE(nn.Module):
    """Router + routed experts (+ shared expert). Experts: w1/w3 [E_local, I_local, D] (gate,
    up), w2 [E_local, D, I_local] (down); whole-model sizes until ``parallel/moe.py`` cuts."""

    def __init__(self, args: ModelArgs, moe: MoEArgs) -> None:
        super().__init__()
        e, i, d = moe.n_experts, moe.expert_size, args.dim
        self.n_experts, self.top_k, self.norm_topk_prob = e, moe.top_k, moe.norm_topk_prob
        self.gate = nn.Linear(d, e, bias=False)  # the router, replicated on every rank
        # uninitialised until loaded (load_moe) or filled (random_moe), like a meta-built model
        self.w1 = nn.Parameter(torch.empty(e, i, d))
        self.w3 = nn.Parameter(torch.empty(e, i, d))
        self.w2 = nn.Parameter(torch.empty(e, d, i))
        self.shared = SharedExpert(d, moe.shared_expert_size) if moe.shared_expert_size else None
        self.expert_start = 0  # global index of this rank's first expert
        #: "grouped": rows sorted by expert, one grouped matmul per projection, each expert
        #: multiplies only its tokens (``ops/experts.py``); "routed": each token's k choices,
        #: their weights gathered by index (zero weight for a choice another rank owns);
        #: "dense": every local expert for every token (zero weight where not routed); "auto":
        #: routed in a compiled graph where T x k <= local experts (decode: Inductor fuses the
        #: gather into the matmul), else grouped (plain PyTorch would copy the gathered
        #: weights). All are exact and static-shape.
        self.compute = "auto"
        self.group: dist.ProcessGroup | None = None  # EP x TP group; set by parallel.moe

    @property
    def local_experts(self) -> int:
        return self.w1.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        # x: [B, S, D] (the same on every rank of the group) -> [B, S, D]
        b, s, d = x.shape
        h = x.reshape(b * s, d)  # [T, D]
        forms = {"grouped": self._grouped, "routed": self._routed, "dense": self._dense}
        mode = self.compute_for(b * s)
        if mode not in forms:
            raise ConfigError(f"SparseMoE.compute={mode!r}; use one of {[*forms, 'auto']}")
        out = forms[mode](h)  # [T, D]
        if self.shared is not None:
            out = out + self.shared(h)
        if self.group is not None:
            # the one collective of the layer's MLP: every expert's and TP shard's partial sum
            out = funcol.all_reduce(out, "sum", self.group)
        return out.view(b, s, d)

    def compute_for(self, tokens: int | torch.SymInt) -> str:
        """The compute form for ``tokens`` tokens (``compute`` unless it is "auto")."""
        if self.compute != "auto":
            return self.compute
        if not torch.compiler.is_compiling():  # decided once per traced graph
            return "grouped"
        # a dynamic token count (the step's rows or chunk): routed only where every size its
        # range allows fits, so the choice adds no guard that would split the range
        fits = statically_known_true(tokens * self.top_k <= self.local_experts)
        return "routed" if fits else "grouped"

    def _grouped(self, h: Tensor) -> Tensor:
        top_w, top_i = top_k_routing(self.gate(h), self.top_k, self.norm_topk_prob)  # [T, k]
        return moe_experts(h, top_i, top_w, self.w1, self.w3, self.w2, self.expert_start)

    def _dense(self, h: Tensor) -> Tensor:
        weights = route(
            self.gate(h), self.top_k, self.norm_topk_prob, self.expert_start, self.local_experts
        )  # [T, E_local]
        g = torch.matmul(h, self.w1.transpose(1, 2))  # [E_local, T, I_local]
        u = torch.matmul(h, self.w3.transpose(1, 2))
        y = torch.matmul(F.silu(g) * u, self.w2.transpose(1, 2))  # [E_local, T, D]
        return (y * weights.t().to(y.dtype)[..., None]).sum(dim=0)  # [T, D]

    def _routed(self, h: Tensor) -> Tensor:
        t, d = h.shape
        top_w, top_i = top_k_routing(self.gate(h), self.top_k, self.norm_topk_prob)  # [T, k]
        local = top_i - self.expert_start
        mine = (local >= 0) & (local < self.local_experts)
        idx = torch.where(mine, local, torch.zeros_like(local)).reshape(-1)  # [T*k]
        w = (top_w * mine).reshape(-1, 1)  # [T*k, 1] float32, 0 for another rank's expert
        hr = h.repeat_interleave(self.top_k, dim=0)[..., None]  # [T*k, D, 1]
        g = torch.bmm(self.w1[idx], hr)  # [T*k, I_local, 1]
        u = torch.bmm(self.w3[idx], hr)
        y = torch.bmm(self.w2[idx], F.silu(g) * u).squeeze(-1)  # [T*k, D]
        return (y * w.to(y.dtype)).view(t, self.top_k, d).sum(dim=1)  # [T, D]


class MoETransformer(Transformer):
    """A Llama-family decoder whose ``moe.sparse_layers`` use :class:`SparseMoE` MLPs."""

    def __init__(self, args: ModelArgs, moe: MoEArgs) -> None:
        super().__init__(args)
        self.moe = moe
        for i in moe.sparse_layers:
            self.blocks[i].feed_forward = SparseMoE(args, moe)  # type: ignore[assignment]

    @property
    def sparse_blocks(self) -> list[SparseMoE]:
        ffns: list[nn.Module] = [b.feed_forward for b in self.blocks]
        return [f for f in ffns if isinstance(f, SparseMoE)]
