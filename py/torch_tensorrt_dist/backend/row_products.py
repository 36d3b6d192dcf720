"""The Inductor engine's products with weights as vectorized reductions, for steps of few rows
(``CompileSettings.cpu_gemm="reduce"``): what a decode step of 1 to a few rows on a CPU needs.

    n = products_as_reductions(aten_gm, gemm_weights(real_inputs))   # before Inductor

``x @ w.t()`` (``F.linear``: ``mm(x, permute(w, [1, 0]))`` or ``addmm``; ``w`` a 2-D float32
parameter, a graph input, laid out row-major, [out, in]) becomes
``sum(w[:, None, :] * x[None, :, :], -1).t()``. Inductor generates one C++ loop nest for it:
over the outputs, then the rows, each output a dot product along the weight's contiguous row,
vectorized. Each weight row is read from memory once a step and used for every row of the
step from the L1 cache; nothing is packed. Why: a decode step of few rows is bound by reading
the weights, and ATen's GEMM (MKL) reads them well below the memory's speed at few rows.
Measured on the bench checkpoint's shapes (fp32, one thread, this AMD EPYC; 48 weights of
768 x 256, out of cache): 29 against 51 (column-major) to 94 us (row-major) a product at
1 row, 74 against 99-165 at 8, about the same at 32. The whole decode step: see
``REDUCE_ROWS`` (``generation/generate.py``); from about 16 rows on, Inductor's one
accumulator per output (no register blocking over the rows) loses to MKL's GEMM, so the
generator gives the reductions to decode steps of few rows only.

The operand that is not the weight is made a buffer first (``inductor_force_stride_order``):
Inductor would otherwise compute what produces it (an RMSNorm's scaling, SiLU times the up
projection) again inside the loop, once per output. Its values are those of ``mm`` to float32
rounding (the sum runs in another order); each row's result does not depend on the other rows
of the step.

Nothing here applies to a product of two activations, to a weight that is not float32 or not
row-major (``models/weight_layout.py`` lays them out column-major for ATen's products; the
generator keeps them row-major with ``reduce``), or to another engine.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import torch
from torch import fx
from torch._dynamo.utils import counters

__all__ = ["products_as_reductions"]

logger = logging.getLogger(__name__)

aten = torch.ops.aten


def products_as_reductions(gm: fx.GraphModule, weights: Collection[int]) -> int:
    """Rewrite ``gm``'s products of an activation with a row-major float32 weight (one of the
    graph inputs at the positions ``weights``: ``cpu_gemm.gemm_weights``) as reductions, in
    place; returns how many (also counted in Dynamo's
    ``counters["torch_tensorrt_dist"]["reduced_products"]``)."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    allowed = {placeholders[i] for i in weights if i < len(placeholders)}
    rewritten = 0
    for node in list(graph.nodes):
        operands = _product_operands(node, allowed)
        if operands is None:
            continue
        x, w, bias = operands
        with graph.inserting_before(node):
            k = int(w.meta["val"].shape[1])
            buffered = graph.call_function(
                torch.ops.prims.inductor_force_stride_order.default, (x, [k, 1])
            )
            prod = graph.call_function(
                aten.mul.Tensor,
                (
                    graph.call_function(aten.unsqueeze.default, (w, 1)),
                    graph.call_function(aten.unsqueeze.default, (buffered, 0)),
                ),
            )
            summed = graph.call_function(aten.sum.dim_IntList, (prod, [2]))
            out = graph.call_function(aten.permute.default, (summed, [1, 0]))
            if bias is not None:
                out = graph.call_function(aten.add.Tensor, (out, bias))
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
        gm.recompile()
        counters["torch_tensorrt_dist"]["reduced_products"] += rewritten
    logger.debug("%d products with weights as reductions", rewritten)
    return rewritten


def _product_operands(
    node: fx.Node, weights: set[fx.Node]
) -> tuple[fx.Node, fx.Node, fx.Node | None] | None:
    """(activation, weight, bias or None) of ``mm(x, w.t())`` / ``addmm(b, x, w.t())`` with
    ``w`` in ``weights``, float32 and row-major; None for any other node."""
    if node.op != "call_function" or node.kwargs:
        return None
    bias: fx.Node | None = None
    if node.target is aten.mm.default:
        x, wt = node.args
    elif node.target is aten.addmm.default and len(node.args) == 3:
        b, x, wt = node.args
        if not isinstance(b, fx.Node) or (bv := _val(b)) is None or bv.dim() != 1:
            return None
        bias = b
    else:
        return None
    if not isinstance(x, fx.Node) or not isinstance(wt, fx.Node):
        return None
    w = _transposed(wt)
    if w not in weights:
        return None
    xv, wv = _val(x), _val(w)
    if xv is None or wv is None or xv.dim() != 2 or wv.dim() != 2:
        return None
    if xv.dtype != torch.float32 or wv.dtype != torch.float32 or xv.device.type != "cpu":
        return None
    if not wv.is_contiguous():  # column-major: ATen's product reads it better
        return None
    return x, w, bias


def _transposed(node: fx.Node) -> fx.Node | None:
    """``w`` where ``node`` is ``w.t()`` (``permute(w, [1, 0])``)."""
    if node.op != "call_function":
        return None
    transposes = node.target is aten.t.default or (
        node.target is aten.permute.default and node.args[1] in ([1, 0], (1, 0))
    )
    src = node.args[0] if transposes else None
    return src if isinstance(src, fx.Node) else None


def _val(node: fx.Node) -> torch.Tensor | None:
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None
