"""``aten.gather`` with dynamic shapes: TensorRT's IGatherLayer in ELEMENT mode.

The paged step gathers along a dynamic dimension twice: each token's block from its row's table
(``table.gather(1, col)``, ``models/paged.py``) and each row's last real token
(``x.gather(1, last)``, ``Transformer.paged_step``). Torch-TensorRT 2.14 registers its gather
converter without ``supports_dynamic_shapes`` (``aten_ops_converters.py``, ``aten_ops_gather``),
so with R, S or NB dynamic both would run in PyTorch and split the engine. Its body
(``impl/select.py`` ``gather``) is one ``add_gather(input, index, axis)`` with
``GatherMode.ELEMENT`` after a cast of the index to int32: nothing in it reads a size, and
TensorRT defines the ELEMENT mode for any shapes (``NvInfer.h``, ``IGatherLayer``: index rank
equal to the data's, output shaped as the index, ``output[J] = data[J with J[axis] = index[J]]``,
which is ``torch.gather``). So the same body is registered here with dynamic shapes, for the
calls :func:`gather_decision` accepts: index and input of one rank, an integer index, and every
dimension but ``dim`` of the index no larger than the input's for every value of the symbols.

:func:`gather_decision` is pure (tested on CPU); :func:`convert_gather` is the TensorRT shell.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.conversion.interface import Decision

__all__ = ["convert_gather", "gather_decision", "gather_validator"]

_aten = torch.ops.aten


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _at_most(a: Any, b: Any) -> bool:
    """``a <= b`` for every value of their symbols (no guard added)."""
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a <= b))


def gather_decision(node: fx.Node) -> Decision:
    """Can this ``aten.gather`` be TensorRT's ELEMENT gather whatever its dynamic sizes?"""
    if node.target is not _aten.gather.default or len(node.args) < 3:
        return Decision(False, f"{node.format_node()} is not aten.gather.default")
    sparse = node.args[3] if len(node.args) > 3 else node.kwargs.get("sparse_grad", False)
    x, dim, index = node.args[:3]
    xv, iv = _val(x), _val(index)
    if sparse:
        return Decision(False, "a sparse-gradient gather")
    if xv is None or iv is None or not isinstance(dim, int):
        return Decision(False, "input or index has no traced value, or dim is not an int")
    if xv.dim() != iv.dim() or xv.dim() == 0:
        return Decision(False, f"index of rank {iv.dim()} for input of rank {xv.dim()}")
    if iv.dtype not in (torch.int64, torch.int32):
        return Decision(False, f"index of dtype {iv.dtype}")
    axis = dim % xv.dim()
    for d in range(xv.dim()):
        if d != axis and not _at_most(iv.shape[d], xv.shape[d]):
            return Decision(False, f"index dim {d} ({iv.shape[d]}) may exceed the input's")
    return Decision(True, f"IGatherLayer (ELEMENT) on dim {axis}")


def gather_validator(node: fx.Node, compilation_settings: Any = None) -> bool:
    """Torch-TensorRT capability validator ``(node, settings) -> bool``; a refused gather goes
    to Torch-TensorRT's own converter (static shapes) or stays in PyTorch."""
    return gather_decision(node).convertible


def convert_gather(ctx: Any, target: Any, args: Any, kwargs: Any, name: str) -> Any:
    """Torch-TensorRT's gather body (``impl.select.gather``: cast, ``add_gather``, ELEMENT)."""
    from torch_tensorrt.dynamo._SourceIR import SourceIR
    from torch_tensorrt.dynamo.conversion import impl
    from torch_tensorrt.dynamo.conversion.converter_utils import get_trt_tensor

    x = get_trt_tensor(ctx, args[0], f"{name}_input")
    index = get_trt_tensor(ctx, args[2], f"{name}_index")
    return impl.select.gather(ctx, target, SourceIR.ATEN, name, x, args[1], index)
