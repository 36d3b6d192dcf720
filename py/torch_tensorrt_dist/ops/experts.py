"""``torch.ops.tensorrt_dist.moe_experts``: routed SwiGLU experts at the cost of their tokens.

    out = torch.ops.tensorrt_dist.moe_experts(x, expert_ids, expert_weights, w1, w3, w2, start)
    # x [T, D]; expert_ids [T, k] (global ids); expert_weights [T, k] (float32 routing weights)
    # w1, w3 [E, I, D] (gate, up); w2 [E, D, I] (down): this rank's experts start..start+E-1
    # out [T, D]: sum over each token's choices this rank owns of weight x expert(x)

Sorted dispatch: the ``T x k`` (token, choice) rows are sorted by local expert (a choice another
rank owns sorts last), each expert's rows are contiguous, and one grouped matmul per projection
(``torch._grouped_mm`` with the group ends ``offsets`` computed from the ids) multiplies each
group by its expert only. Rows of other ranks' experts lie past ``offsets[-1]``: no expert
multiplies them and they contribute exactly zero (on the CPU they are dropped before the
gather; elsewhere they stay, zeroed, so that the host never waits for the device). The results,
weighted, are added back to their tokens. Shapes depend on ``T`` and ``k`` only, never on the
routing, so a compiled step stays one graph; no token is dropped.

Why one opaque op for the whole expert block: it is the unit TensorRT has a layer for
(``IMoELayer``: hidden states, selected experts, scores, stacked gate/up/down weights;
``conversion/layers/moe_experts.py``), and ``torch._grouped_mm``'s meta kernel in torch 2.14
refuses float32, so it could not be traced into an fp32 graph by itself. Inductor calls the op
as an extern kernel; it contains the matmuls, which Inductor would hand to an extern kernel
anyway.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "EXPERTS_OP",
    "grouped_experts",
    "grouped_mm",
    "grouped_mm_accepts",
    "moe_experts",
    "sorted_dispatch",
]

NAMESPACE = "tensorrt_dist"


def sorted_dispatch(expert_ids: Tensor, start: int, count: int) -> tuple[Tensor, Tensor]:
    """``expert_ids [T, k]`` (global) -> ``(order [T*k], offsets [count] int32)``.

    ``order`` lists the flattened (token, choice) rows grouped by local expert (stable, so a
    group keeps token order); rows whose expert is not in ``[start, start + count)`` come last.
    ``offsets[e]`` is the end of local expert ``e``'s group; ``offsets[-1]`` the rows this rank
    computes. No host synchronisation: everything stays on the ids' device.
    """
    local = expert_ids.reshape(-1) - start
    mine = (local >= 0) & (local < count)
    key = torch.where(mine, local, torch.full_like(local, count))  # another rank's: last
    sorted_key, order = torch.sort(key, stable=True)
    bounds = torch.arange(count, device=key.device, dtype=key.dtype)
    offsets = torch.searchsorted(sorted_key, bounds, right=True, out_int32=True)
    return order, offsets


def grouped_mm_accepts(a: Tensor, b: Tensor) -> bool:
    """Whether ``torch._grouped_mm(a, b, offs=...)`` takes these layouts (torch 2.14: CPU or
    CUDA, every non-unit stride a multiple of 16 bytes, 16-byte aligned data on CUDA)."""
    if a.device.type not in ("cpu", "cuda") or a.dtype != b.dtype:
        return False
    for t in (a, b):
        align = 16 // t.element_size()
        if t.device.type == "cuda" and t.data_ptr() % 16:
            return False
        if t.dim() == 3 and t.stride(0) % align:
            return False
        inner = [s for s in t.stride()[-2:] if s != 1]
        if len(inner) != 1 or inner[0] % align:
            return False
    return True


def grouped_mm(a: Tensor, b: Tensor, offsets: Tensor) -> Tensor:
    """``a [R, K]`` rows grouped by ``offsets`` (group ends, int32) times ``b [G, K, N]``:
    ``out[rows of g] = a[rows of g] @ b[g]``; rows past ``offsets[-1]`` are not computed (their
    values are undefined). ``torch._grouped_mm`` where it takes the layouts, else one ``mm``
    per group (tiny or odd sizes whose strides are not 16-byte multiples)."""
    if grouped_mm_accepts(a, b):
        return torch._grouped_mm(a, b, offs=offsets)
    out = a.new_empty(a.shape[0], b.shape[-1])
    begin = 0
    for g, end in enumerate(offsets.tolist()):
        if end > begin:
            torch.mm(a[begin:end], b[g], out=out[begin:end])
        begin = end
    return out


def _check(x: Tensor, ids: Tensor, weights: Tensor, w1: Tensor, w3: Tensor, w2: Tensor) -> None:
    e, i, d = w1.shape
    if x.dim() != 2 or x.shape[1] != d or w3.shape != w1.shape or tuple(w2.shape) != (e, d, i):
        raise ConfigError(
            f"moe_experts needs x [T, D], w1 and w3 [E, I, D], w2 [E, D, I]; got x "
            f"{list(x.shape)}, w1 {list(w1.shape)}, w3 {list(w3.shape)}, w2 {list(w2.shape)}"
        )
    if ids.dim() != 2 or ids.shape[0] != x.shape[0] or weights.shape != ids.shape:
        raise ConfigError(
            f"moe_experts needs expert_ids and expert_weights [T, k] for T={x.shape[0]} tokens; "
            f"got {list(ids.shape)} and {list(weights.shape)}"
        )


@torch.library.custom_op(f"{NAMESPACE}::moe_experts", mutates_args=())
def moe_experts(
    x: Tensor,
    expert_ids: Tensor,
    expert_weights: Tensor,
    w1: Tensor,
    w3: Tensor,
    w2: Tensor,
    expert_start: int,
) -> Tensor:
    _check(x, expert_ids, expert_weights, w1, w3, w2)
    # on the CPU the host reads the row count for free: other ranks' rows are dropped
    return grouped_experts(
        x, expert_ids, expert_weights, w1, w3, w2, expert_start, host_rows=x.device.type == "cpu"
    )


def grouped_experts(
    x: Tensor,
    expert_ids: Tensor,
    expert_weights: Tensor,
    w1: Tensor,
    w3: Tensor,
    w2: Tensor,
    expert_start: int,
    *,
    host_rows: bool,
) -> Tensor:
    """The op's computation. ``host_rows``: read the number of rows this rank computes on the
    host and drop the others before the gather (free on the CPU); else (no host
    synchronisation of ours; torch's own grouped matmul reads the offsets on the host for
    dtypes other than bfloat16 on CUDA) all T*k rows go through, those of other ranks zeroed
    after the matmuls,
    and the sum over the k choices runs in (token, choice) order (deterministic on any device,
    where CUDA's ``index_add_`` is not)."""
    t, k = expert_ids.shape
    order, offsets = sorted_dispatch(expert_ids, expert_start, w1.shape[0])
    if host_rows:
        order = order[: int(offsets[-1])]
    tokens = order // k  # the token of each sorted row
    xs = x.index_select(0, tokens)  # [n, D]
    g = grouped_mm(xs, w1.transpose(1, 2), offsets)  # [n, I]
    a = F.silu(g, inplace=True).mul_(grouped_mm(xs, w3.transpose(1, 2), offsets))
    y = grouped_mm(a, w2.transpose(1, 2), offsets)  # [n, D]; rows past offsets[-1]: garbage
    if not host_rows:
        y = y.masked_fill_((torch.arange(t * k, device=x.device) >= offsets[-1])[:, None], 0.0)
    w = expert_weights.reshape(-1)[order, None]  # [n, 1] float32
    y = y.mul_(w) if y.dtype == w.dtype else y * w  # half precision: weighted in float32
    if host_rows:
        out = torch.zeros(t, y.shape[1], dtype=y.dtype, device=y.device)
        return out.index_add_(0, tokens, y).to(x.dtype)
    unsorted = torch.empty_like(y).index_copy_(0, order, y)  # back to (token, choice) order
    return unsorted.view(t, k, -1).sum(dim=1).to(x.dtype)  # [T, D]


@moe_experts.register_fake
def _(
    x: Tensor,
    expert_ids: Tensor,
    expert_weights: Tensor,
    w1: Tensor,
    w3: Tensor,
    w2: Tensor,
    expert_start: int,
) -> Tensor:
    _check(x, expert_ids, expert_weights, w1, w3, w2)
    return x.new_empty(x.shape)


EXPERTS_OP = torch.ops.tensorrt_dist.moe_experts.default
