"""The layout of linear weights for CPU matmuls: column-major, so small batches run faster.

    changed = column_major_linears(model)   # before the step is compiled; shapes unchanged
    changed = row_major_linears(model)      # back, as loaded (Qwen3's q, k: one matrix)
    changed = lay_out_linears(model, row_major={torch.float32})   # what ``reduce`` reads

``F.linear(x, w)`` with ``w`` [out, in] multiplies ``x`` by ``w.t()``. Stored row-major (as
loaded), ``w.t()`` is a transposed operand, and MKL's GEMM packs it on every call, which
dominates when a step has few rows (a decode step: 1 to a few dozen). Stored column-major
(strides ``(1, out)``: the same [out, in] tensor, the same values), ``w.t()`` is a plain
row-major [in, out] matrix and nothing is packed. Measured on the serving benchmark's
checkpoint (fp32, one thread, Inductor): a decode step of 1 row 3.88 -> 3.47 ms, of 8 rows
8.26 -> 6.26 ms, the same logits.

Only where it is known to hold: ``nn.Linear`` weights (and subclasses that call
``F.linear``) that are plain floating-point CPU tensors. Quantized linears, embeddings, expert
stacks, DTensor parameters and any weight on a GPU keep their layout. A model whose weights
are then exported by value with fixed strides (AOTInductor packages that load their constants
from a file) must not be changed: the compile-once artifacts use the eager engine and keep
the layout of their weights file.

The products of ``cpu_gemm="reduce"`` (``backend/row_products.py``) read each float32 weight
row as a contiguous vector: they want the row-major layout, and the generator keeps it for
those weights (the others, which ATen's GEMM multiplies, stay column-major).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn

__all__ = [
    "column_major_linears",
    "has_float32_linears",
    "is_column_major",
    "lay_out_linears",
    "row_major_linears",
]

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def is_column_major(w: torch.Tensor) -> bool:
    """A 2-D tensor laid out column-major (``w.t()`` is contiguous)."""
    return w.dim() == 2 and w.t().is_contiguous()


def lay_out_linears(model: nn.Module, row_major: Collection[torch.dtype] = ()) -> int:
    """Re-lay every eligible linear weight of ``model`` in place (the parameter object and its
    shape stay; its storage is replaced): row-major where its dtype is in ``row_major``,
    column-major otherwise; returns how many changed. Row-major float32 (what the row
    products read, ``backend/row_products.py``): Qwen3's q and k weights first become one
    matrix (``llama.Attention.fuse_qk`` says why), which keeps its layout."""
    if torch.float32 in row_major:
        for module in model.modules():
            fuse = getattr(module, "fuse_qk", None)
            if callable(fuse):
                fuse()
    changed = 0
    for w in _eligible(model):
        if w.dtype in row_major:
            if w.is_contiguous():
                continue
            new = w.data.contiguous()
        elif is_column_major(w):
            continue
        else:
            new = w.data.t().contiguous().t()
        with torch.no_grad():
            w.data = new
        changed += 1
    return changed


def column_major_linears(model: nn.Module) -> int:
    """Every eligible linear weight of ``model`` column-major (:func:`lay_out_linears`)."""
    return lay_out_linears(model)


def row_major_linears(model: nn.Module) -> int:
    """Every eligible linear weight of ``model`` row-major, as loaded (the inverse of
    :func:`column_major_linears`)."""
    return lay_out_linears(model, row_major=_FLOATS)


def has_float32_linears(model: nn.Module) -> bool:
    """Whether ``model`` has an eligible float32 linear weight (what ``reduce`` rewrites)."""
    return any(w.dtype == torch.float32 for w in _eligible(model))


def _eligible(model: nn.Module) -> list[torch.Tensor]:
    """The weights of ``model``'s ``nn.Linear`` modules that are plain 2-D floating-point CPU
    tensors of at least two rows and columns (one row or column: both layouts are one), each
    but views of a fused matrix (Qwen3's q and k weights after ``Attention.fuse_qk``: they
    keep its layout)."""
    fused = {
        t.untyped_storage().data_ptr()
        for t in (getattr(m, "wqk", None) for m in model.modules())
        if isinstance(t, torch.Tensor)
    }
    return [
        module.weight
        for module in model.modules()
        if isinstance(module, nn.Linear)
        and type(module.weight.data) is torch.Tensor  # not a DTensor, quantized or fake tensor
        and module.weight.device.type == "cpu"
        and module.weight.is_floating_point()
        and module.weight.dim() == 2
        and min(module.weight.shape) >= 2
        and module.weight.untyped_storage().data_ptr() not in fused
    ]
