"""The Inductor engine's products with weights as vectorized reductions, for steps of few rows
(``CompileSettings.cpu_gemm="reduce"``): what a decode step of 1 to a few rows on a CPU needs.

    n = products_as_reductions(aten_gm, gemm_weights(real_inputs))   # before Inductor

``x @ w.t()`` (``F.linear``: ``mm(x, permute(w, [1, 0]))`` or ``addmm``; ``w`` a 2-D float32
parameter, a graph input, laid out row-major, [out, in]) becomes a call of the C++ op
``rows_mm(x, w)`` (``ops/cpu_rows_mm.py``, an extern kernel for Inductor) where that op builds,
else ``sum(w[:, None, :] * x[None, :, :], -1).t()``. The op keeps the sums of a block of up to 8
token rows in registers at once, each weight vector loaded once for the block, and prefetches
the weights ahead: 5 or 8 token rows cost 1.06x and 1.23x one on the Xeon where it was
written, 2.0x and 3.7x on an AMD EPYC (Zen 4), whose one row reads the weights 2.5x faster
while 5 rows' multiply-adds take as long (its docstring has the figures). The reduction's
form is what it replaced: Inductor generates one C++ loop nest for it:
over the outputs, then the rows, each output a dot product along the weight's contiguous row,
vectorized. Each weight row is read from memory once a step and used for every row of the
step from the L1 cache; nothing is packed. Why: a decode step of few rows is bound by reading
the weights, and ATen's GEMM (MKL) reads them well below the memory's speed at few rows.
Measured on the bench checkpoint's shapes (fp32, one thread, this AMD EPYC; 48 weights of
768 x 256, out of cache): 29 against 51 (column-major) to 94 us (row-major) a product at
1 row, 74 against 99-165 at 8, about the same at 32. The whole decode step: see
``REDUCE_ROWS`` (``generation/generate.py``); from about 16 rows on, Inductor's one
accumulator per output (no register blocking over the rows) loses to MKL's GEMM, so the
generator gives the reductions to steps of few token rows only (rows x tokens). The op does
not lose there: the demo model's 29 products through it against ATen's (row-major, one
thread, this Xeon, CPU time, load average 11) take 0.87x ATen's time at 1 row, 0.54x at 8,
0.68x at 20 and 0.95x at 40 (at two threads 0.05-0.3x); ``REDUCE_ROWS`` has not moved.

The operand that is not the weight is made a buffer first (``inductor_force_stride_order``):
Inductor would otherwise compute what produces it (an RMSNorm's scaling, SiLU times the up
projection) again inside the loop, once per output. Its values are those of ``mm`` to float32
rounding (the sum runs in another order); each row's result does not depend on the other rows
of the step.

The op adds each output's products as 16 lane sums along the row, then a tree; Inductor's
vectorized reduction did the same here (the demo model's logits came out equal either way).

Nothing here applies to a product of two activations, to a weight that is not float32 or not
row-major (``models/weight_layout.py`` lays them out column-major for ATen's products; the
generator keeps them row-major with ``reduce``), or to another engine.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

import torch
from torch import fx
from torch._dynamo.utils import counters

__all__ = ["gemm_weights", "products_as_reductions"]

logger = logging.getLogger(__name__)

aten = torch.ops.aten

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def gemm_weights(real_inputs: Sequence[Any]) -> list[int]:
    """Positions of the graph inputs that are weights of products: 2-D floating
    ``nn.Parameter``s on the CPU (which of them are rewritten: :func:`products_as_reductions`)."""
    return [
        i
        for i, t in enumerate(real_inputs)
        if isinstance(t, torch.nn.Parameter)
        and t.dim() == 2
        and t.dtype in _FLOATS
        and t.device.type == "cpu"
    ]


def products_as_reductions(
    gm: fx.GraphModule,
    weights: Collection[int],
    inputs: int | None = None,
    *,
    kernel: bool = True,
) -> int:
    """Rewrite ``gm``'s products of an activation with a row-major float32 weight (one of the
    graph inputs at the positions ``weights``: :func:`gemm_weights` of the ``inputs``
    inputs Dynamo gave) as ``rows_mm`` calls (``kernel`` and the op builds) or reductions, in
    place; returns how many (also counted in Dynamo's
    ``counters["torch_tensorrt_dist"]["reduced_products"]``). Where the graph does not have
    ``inputs`` placeholders (an input that AOTAutograd flattened or added), the positions say
    nothing: nothing is rewritten (a log line says so)."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if inputs is not None and inputs != len(placeholders):
        logger.info(
            "cpu_gemm='reduce': the graph has %d inputs where %d were given; its products "
            "stay ATen's",
            len(placeholders),
            inputs,
        )
        return 0
    allowed = {placeholders[i] for i in weights if i < len(placeholders)}
    op = _rows_mm() if kernel else None
    rewritten = 0
    for node in list(graph.nodes):
        operands = _product_operands(node, allowed)
        if operands is None:
            continue
        x, w, bias = operands
        if op is not None:  # the register-blocked kernel (``ops/cpu_rows_mm.py``)
            with graph.inserting_before(node):
                out = graph.call_function(op, (x, w))
                if bias is not None:
                    out = graph.call_function(aten.add.Tensor, (out, bias))
            _replace(graph, node, out)
            rewritten += 1
            continue
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
            if _feeds_output(node):  # the logits: row-major, as the product gave them
                out = graph.call_function(
                    aten.clone.default, (out,), {"memory_format": torch.contiguous_format}
                )
                out.meta = dict(node.meta)
        _replace(graph, node, out)
        rewritten += 1
    if rewritten:
        gm.recompile()
        counters["torch_tensorrt_dist"]["reduced_products"] += rewritten
    logger.debug("%d products with weights as reductions", rewritten)
    return rewritten


def _rows_mm() -> Any:
    """The ``rows_mm`` op where it builds (``ops/cpu_rows_mm.py``), else None."""
    from torch_tensorrt_dist.ops import cpu_rows_mm

    return torch.ops.tensorrt_dist_gemm.rows_mm.default if cpu_rows_mm.available() else None


def _replace(graph: fx.Graph, node: fx.Node, out: fx.Node) -> None:
    """``out`` in place of the product ``node``; its weight's transpose goes with it."""
    transpose = node.args[-1]
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    if isinstance(transpose, fx.Node) and not transpose.users:
        graph.erase_node(transpose)


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


#: ops through which a product's layout reaches the graph's output unchanged in kind
_VIEWS = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.select.int,
    aten.slice.Tensor,
    aten.squeeze.dim,
    aten.unsqueeze.default,
}


def _feeds_output(node: fx.Node, depth: int = 4) -> bool:
    """Whether ``node`` is a graph output, directly or through a few views."""
    for user in node.users:
        if user.op == "output":
            return True
        if (
            depth
            and user.op == "call_function"
            and user.target in _VIEWS
            and _feeds_output(user, depth - 1)
        ):
            return True
    return False


def _val(node: fx.Node) -> torch.Tensor | None:
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None
