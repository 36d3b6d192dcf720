"""Contiguous query and key for ``flex_attention`` on CPU, before Inductor (a torch bug).

Inductor's CPU flex-attention template (``CppFlexAttentionTemplate.choose_flex_template`` in
torch 2.14) reads the query's sizes from the buffer *under* the query's view
(``query.data.data.layout.size``) and unpacks four of them. A query computed by a complex RoPE
(``view_as_complex`` ... ``view_as_real`` then ``flatten``: torchtitan's Llama 3 and any
model with Meta's original RoPE) is a view of a 5-d buffer, so compiling fails with
``LoweringException: ValueError: too many values to unpack (expected 4)``; for a transposed
query the sizes it reads are in the wrong order. A contiguous copy of query and key (which
Inductor usually fuses into their producer) gives the template 4-d buffers of its own.
Used by the ``inductor`` engine only, for CPU tensors only.
"""

from __future__ import annotations

import torch
from torch import fx

__all__ = ["contiguous_flex_inputs"]


def contiguous_flex_inputs(gm: fx.GraphModule) -> int:
    """Copy the CPU query and key of each ``flex_attention`` to contiguous memory, in place.

    Returns the number of copies inserted.
    """
    flex = torch.ops.higher_order.flex_attention
    inserted = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=flex)):
        for index in (0, 1):  # query, key
            arg = node.args[index]
            val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
            if not isinstance(val, torch.Tensor) or val.device.type != "cpu":
                continue
            with gm.graph.inserting_before(node):
                copy = gm.graph.call_function(
                    torch.ops.aten.clone.default, (arg,), {"memory_format": torch.contiguous_format}
                )
            copy.meta["val"] = torch.ops.aten.clone.default(
                val, memory_format=torch.contiguous_format
            )
            node.update_arg(index, copy)
            inserted += 1
    if inserted:
        gm.graph.lint()
        gm.recompile()
    return inserted
