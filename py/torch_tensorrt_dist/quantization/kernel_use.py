"""Which kernel reads each quantized weight in a compiled graph (Inductor's post-grad graph).

    with post_grad_graphs() as graphs:
        decode(*inputs)                        # a step compiled with engine="inductor"
    use = weight_only_use(graphs[-1])
    assert use.kernels and not use.dequantized

A quantized weight is a graph input of dtype int8 or uint8 (codes). In a good decode graph
every one of them is read only by a weight-only kernel; any other reader (a dtype conversion,
a multiply by the scales) means the graph dequantizes that whole matrix into a temporary, which
is what Inductor makes of gpt-fast's ``linear(x, w.to(x.dtype)) * scales`` in float32.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import fx

__all__ = ["WEIGHT_ONLY_OPS", "WeightUse", "post_grad_graphs", "weight_only_use"]

_aten = torch.ops.aten

#: the weight-only matmuls, by the name the report uses
WEIGHT_ONLY_OPS: dict[object, str] = {
    _aten._weight_int8pack_mm.default: "aten._weight_int8pack_mm",
    _aten._weight_int4pack_mm_for_cpu.default: "aten._weight_int4pack_mm_for_cpu",
    _aten._weight_int4pack_mm.default: "aten._weight_int4pack_mm",
}
_CODE_DTYPES = (torch.int8, torch.uint8)


@dataclass
class WeightUse:
    kernels: Counter[str] = field(default_factory=Counter)
    """Weight-only kernel -> number of calls on quantized weights."""
    dequantized: list[str] = field(default_factory=list)
    """Quantized inputs that something other than a weight-only kernel reads."""

    def describe(self) -> str:
        calls = ", ".join(f"{name} x {n}" for name, n in sorted(self.kernels.items()))
        return (calls or "no weight-only kernel") + (
            f"; {len(self.dequantized)} matrices dequantized" if self.dequantized else ""
        )


def _is_code(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype in _CODE_DTYPES and val.dim() >= 2


def weight_only_use(graph: fx.Graph) -> WeightUse:
    """Classify every reader of every quantized graph input (see the module docstring)."""
    ops = dict(WEIGHT_ONLY_OPS)
    int4_op = getattr(getattr(torch.ops, "tensorrt_dist", None), "int4_weight_only_mm", None)
    if int4_op is not None:
        ops[int4_op.default] = "tensorrt_dist.int4_weight_only_mm"
    use = WeightUse()
    for node in graph.find_nodes(op="placeholder"):
        if not _is_code(node):
            continue
        for user in node.users:
            name = ops.get(user.target)
            if name is None:
                use.dequantized.append(node.name)
                break
            use.kernels[name] += 1
    return use


@contextlib.contextmanager
def post_grad_graphs() -> Iterator[list[fx.Graph]]:
    """Collect the post-grad graph of every Inductor compile inside the block (what Inductor
    lowers to kernels, after its own pattern rewrites)."""
    from torch._inductor import config

    graphs: list[fx.Graph] = []
    with config.patch(post_grad_custom_post_pass=graphs.append):
        yield graphs
