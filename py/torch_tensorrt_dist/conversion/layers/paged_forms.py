"""What each op of the paged KV cache becomes in a TensorRT engine (pure; read by ``explain``).

    block write   index_put(pool, [blk, off], k)   PyTorch, in place (``paged_kv.py``)
    block read    index(pool, [table])             IGatherLayer on axis 0 (Torch-TensorRT's
                                                   ``aten_ops_index``: HIGH priority, dynamic
                                                   shapes; ``impl/select.py`` ``index``: one
                                                   index tensor -> ``add_gather(pool, table, 0)``)
    attention     scaled_dot_product_attention      IAttention (Torch-TensorRT's SDPA converters,
                  (traced on CUDA: the efficient,   ``impl/attention.py``: ``add_attention_v2``
                  cuDNN or flash variant)           with ``CausalMaskKind.NONE`` and the mask as
                                                    given, bool or additive; ``decomposable``)

The block read copies each row's NB blocks (``NB * bs * H * D`` elements per row): what the
rows hold, not the reserved pool. Attention gets the padded forms (``AttentionIOForm.PADDED_BHND``,
the default) with grouped-query heads folded into the query length (``[R, H_kv, rep * S, D]``,
so IAttention sees as many query as key heads) and the mask ``[R, 1, rep * S, NB * bs]``.

TensorRT 11.1's IAttention also takes per-row key/value lengths (``setKeyValueLengths``: a
``[batch]`` INT32 tensor in the padded form) and a bottom-right causal alignment
(``CausalMaskKind::kLOWER_RIGHT``); Torch-TensorRT 2.14 sets neither. For a decode step without
a sliding window the mask is exactly "key < start + 1" for every query of a row, so lengths
``start + 1`` and no mask would be the same attention. A prefill chunk is not: its rows are
right-padded (a padded row's real queries would be shifted by the bottom-right alignment) and
folding the heads into the query length breaks the alignment too; only the packed query form
(``PACKED_NHD`` with ``[R + 1]`` cumulative query lengths) or the mask expresses it. The mask is
kept for both.

Keep Torch-TensorRT's ``attn_bias_is_causal`` off (our default, ``conversion/engine.py``): with
it on, its ``force_causal_efficient_attention`` pass replaces the mask by a plain causal one
wherever query and key lengths happen to match (``rep * S == NB * bs``), which is wrong here.
"""

from __future__ import annotations

import operator
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.conversion.layers.paged_kv import pool_writes

__all__ = ["PagedOp", "attention_form", "block_read", "engine_count", "paged_ops"]

_aten = torch.ops.aten
#: the SDPA variants a graph traced on CUDA holds, each with a Torch-TensorRT converter
_SDPA = {
    _aten.scaled_dot_product_attention.default: 3,  # where the mask argument sits (or None)
    _aten._scaled_dot_product_efficient_attention.default: 3,
    _aten._scaled_dot_product_cudnn_attention.default: 3,
    _aten._scaled_dot_product_flash_attention.default: None,
}
_CPU_SDPA = _aten._scaled_dot_product_flash_attention_for_cpu.default


@dataclass(frozen=True)
class PagedOp:
    """One op of the paged cache and its TensorRT form."""

    kind: str
    """``block write``, ``block read`` or ``attention``."""
    node: str
    form: str
    in_engine: bool
    reason: str


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _reads_pool(node: Any) -> bool:
    """``node`` is a pool: a 4-D graph input, or a block write's result (the pool written)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function" and node.target in (
        _aten.index_put.default,
        _aten.index_put_.default,
    ):
        return _reads_pool(node.args[0])
    val = _val(node)
    return node.op == "placeholder" and val is not None and val.dim() == 4


def block_read(node: fx.Node) -> PagedOp | None:
    """``index(pool, [table])`` (each row's blocks), or None."""
    if node.op != "call_function" or node.target is not _aten.index.Tensor:
        return None
    src, indices = node.args[:2]
    idx = list(indices) if isinstance(indices, (list, tuple)) else []
    table = _val(idx[0]) if len(idx) == 1 else None
    if not _reads_pool(src) or table is None or table.dtype not in (torch.int64, torch.int32):
        return None
    return PagedOp(
        "block read",
        node.name,
        "IGatherLayer (axis 0)",
        True,
        "Torch-TensorRT's aten.index converter (dynamic shapes): add_gather(pool, table, 0), "
        "each row's blocks only",
    )


def _mask(node: fx.Node) -> Any:
    position = _SDPA.get(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
    if position is None:
        return node.kwargs.get("attn_mask")
    return node.args[position] if len(node.args) > position else node.kwargs.get("attn_mask")


def attention_form(node: fx.Node) -> PagedOp | None:
    """An SDPA call and what Torch-TensorRT makes of it (its validators' checks), or None."""
    if node.op != "call_function" or (node.target not in _SDPA and node.target is not _CPU_SDPA):
        return None
    q, k, v = (_val(a) for a in node.args[:3])
    if q is None or k is None or v is None:
        return PagedOp("attention", node.name, "PyTorch", False, "q, k or v has no traced value")
    mask = _mask(node)
    if node.target is _CPU_SDPA:
        return PagedOp(
            "attention",
            node.name,
            "IAttention",
            True,
            "traced on CPU (the CPU kernel); on CUDA the same call traces to an efficient, "
            "cuDNN or flash variant, which Torch-TensorRT turns into IAttention with the mask",
        )
    gqa = bool(node.kwargs.get("enable_gqa", False))
    same = q.dim() == k.dim() == v.dim() and tuple(k.shape) == tuple(v.shape)
    dims = [d for d in range(q.dim()) if d != q.dim() - 2 and not (gqa and d == 1)]
    if not same or any(q.shape[d] != k.shape[d] for d in dims):
        return PagedOp(
            "attention",
            node.name,
            "PyTorch",
            False,
            "Torch-TensorRT's SDPA validator refuses these shapes (batch, heads or head dim "
            "differ between query and key, or key and value differ)",
        )
    masked = "a mask" if isinstance(mask, fx.Node) else "no mask"
    return PagedOp(
        "attention",
        node.name,
        "IAttention",
        True,
        f"add_attention_v2 (padded [B, H, S, D], {masked}, no key/value lengths)",
    )


def paged_ops(gm: fx.GraphModule, outputs: Collection[fx.Node] | None = None) -> list[PagedOp]:
    """The block writes, block reads and attention calls of ``gm``, in graph order
    (``outputs``: the mutation outputs; default: from the compile running now)."""
    writes = {w.node: w for w in pool_writes(gm, outputs)}
    out = []
    for node in gm.graph.nodes:
        write = writes.get(node.name)
        if write is not None:
            form = "PyTorch, in place" if write.in_place else "IScatterLayer (a copy)"
            out.append(PagedOp("block write", node.name, form, not write.in_place, write.reason))
            continue
        found = block_read(node) or attention_form(node)
        if found is not None:
            out.append(found)
    return out


def _free(node: fx.Node) -> bool:
    """Not an op of an engine: tuple items, size arithmetic, an input's write-back."""
    if node.target is operator.getitem:
        return True
    if node.target is _aten.copy_.default and getattr(node.args[0], "op", None) == "placeholder":
        return True  # the eager form's write-back of an input (none in a TensorRT graph)
    val = node.meta.get("val")
    return isinstance(val, (int, torch.SymInt))


def engine_count(gm: fx.GraphModule, in_pytorch: Collection[str]) -> int:
    """How many engines a graph splits into when the nodes named ``in_pytorch`` run in PyTorch
    and every other op converts: the runs of converted ops between them, in graph order (what
    Torch-TensorRT's default adjacency partitioner makes; an estimate, since an op without a
    converter would add splits)."""
    engines, open_run = 0, False
    for node in gm.graph.nodes:
        if node.op != "call_function" or _free(node):
            continue
        if node.name in in_pytorch:
            open_run = False
        elif not open_run:
            engines, open_run = engines + 1, True
    return engines
