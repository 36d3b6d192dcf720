"""Outputs compared within a dtype-aware tolerance (what ``verify.py`` judges an engine by).

    m = compare_outputs(expected, actual)       # None, or the first Mismatch
    m.describe()                                # its name, shape, dtype, the first bad element

Tolerances (``|got - expected| <= tol * (|expected| + max|expected|)``, elementwise, where
``max|expected|`` is the largest finite magnitude of that output, so near-zero elements of a
large output are judged on the output's scale): integers and bools exact; float64 1e-6;
float32 1e-2 (TensorRT uses TF32 for fp32 matmuls and convolutions by default, about 1e-3
relative per product, compounding over layers); float16 2e-2; bfloat16 5e-2 (8-bit mantissa);
other floating types (fp8) 1e-1. A wrong collective (a missing or extra rank's contribution)
changes outputs by O(1) of their scale, far above these. NaN matches NaN, and an infinity the
same infinity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

__all__ = ["DEFAULT_TOLERANCES", "Mismatch", "compare_outputs", "tolerance_for"]

#: relative tolerance of floating outputs by dtype (see the module docstring for why)
DEFAULT_TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-6,
    torch.float32: 1e-2,
    torch.float16: 2e-2,
    torch.bfloat16: 5e-2,
}
#: floating dtypes not in the table (fp8 and other narrow types)
OTHER_FLOAT_TOLERANCE = 1e-1


def tolerance_for(dtype: torch.dtype, override: float | None = None) -> float:
    """The relative tolerance of an output of ``dtype`` (0: exact; ``override`` for floats)."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0
    if override is not None:
        return override
    return DEFAULT_TOLERANCES.get(dtype, OTHER_FLOAT_TOLERANCE)


@dataclass(frozen=True)
class Mismatch:
    """The first output (in flattened order) where the engine differs from the reference."""

    index: int
    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    max_abs_error: float
    tolerance: str
    detail: str

    def describe(self) -> str:
        what = f"{self.dtype}{list(self.shape)}" if self.shape is not None else "non-tensor"
        return (
            f"{self.name} ({what}) differs from the eager reference: {self.detail}; "
            f"max abs error {self.max_abs_error:.4g}, tolerance {self.tolerance}"
        )


def _tensor_mismatch(e: Tensor, a: Tensor, tol: float) -> tuple[float, str, str] | None:
    """``(max abs error, tolerance text, detail)`` where ``a`` is not close to ``e``."""
    if a.shape != e.shape:
        return float("inf"), "-", f"shape {list(a.shape)} instead of {list(e.shape)}"
    if a.dtype != e.dtype:
        return float("inf"), "-", f"dtype {a.dtype} instead of {e.dtype}"
    a = a.detach().to(e.device)
    e = e.detach()
    if e.numel() == 0:
        return None
    if tol == 0.0:  # integers and bools: exact
        bad = a != e
        tol_text = "exact"
        diff = (a.to(torch.float64) - e.to(torch.float64)).abs()
    else:
        # float32 math is exact enough for these tolerances and halves float64's memory (a KV
        # cache is compared whole); float64 outputs keep float64
        wide = {torch.float64: torch.float64, torch.complex128: torch.complex128}.get(
            e.dtype, torch.complex64 if e.is_complex() else torch.float32
        )
        ew, aw = e.to(wide), a.to(wide)
        nan_e, nan_a = torch.isnan(ew), torch.isnan(aw)
        finite = torch.isfinite(ew)
        scale = float(ew[finite].abs().max()) if bool(finite.any()) else 0.0
        same_special = (nan_e & nan_a) | (torch.isinf(ew) & (ew == aw))
        special = ~torch.isfinite(ew) | ~torch.isfinite(aw)
        diff = (aw - ew).abs()
        diff = torch.where(same_special, torch.zeros_like(diff), diff)
        diff = torch.where(special & ~same_special, torch.full_like(diff, float("inf")), diff)
        bad = (diff > tol * (ew.abs() + scale)) | (special & ~same_special)
        tol_text = f"{tol:g} * (|expected| + {scale:.4g})"
    if not bool(bad.any()):
        return None
    flat = int(torch.nonzero(bad.flatten())[0])
    pos = list(torch.unravel_index(torch.tensor(flat), e.shape)) if e.dim() else []
    where = [int(p) for p in pos]
    detail = (
        f"{int(bad.sum())} of {e.numel()} elements outside tolerance, the first at {where} "
        f"(expected {e.flatten()[flat].item():.6g}, got {a.flatten()[flat].item():.6g})"
    )
    return float(diff.max()), tol_text, detail


def compare_outputs(
    expected: Any,
    actual: Any,
    *,
    tolerance: float | None = None,
    names: Sequence[str] | None = None,
) -> Mismatch | None:
    """The first leaf of ``actual`` that differs from ``expected`` (nested lists/tuples/dicts).

    Tensors: same shape and dtype, then integers and bools exactly, floats within
    :func:`tolerance_for` (``tolerance`` overrides every float dtype). Other leaves: ``==``.
    ``names[i]`` names flattened leaf ``i`` in the result (default ``output i``).
    """
    exp_leaves, _ = tree_flatten(expected)
    act_leaves, _ = tree_flatten(actual)
    if len(exp_leaves) != len(act_leaves):
        return Mismatch(
            -1,
            "the outputs",
            None,
            None,
            float("inf"),
            "-",
            f"{len(act_leaves)} outputs instead of {len(exp_leaves)}",
        )
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        name = names[i] if names is not None and i < len(names) else f"output {i}"
        if isinstance(e, Tensor) and isinstance(a, Tensor):
            found = _tensor_mismatch(e, a, tolerance_for(e.dtype, tolerance))
            if found is not None:
                err, tol_text, detail = found
                return Mismatch(
                    i,
                    name,
                    tuple(e.shape),
                    str(e.dtype).removeprefix("torch."),
                    err,
                    tol_text,
                    detail,
                )
        elif isinstance(e, Tensor) or isinstance(a, Tensor) or e != a:
            return Mismatch(
                i,
                name,
                None,
                None,
                float("inf"),
                "exact",
                f"got {type(a).__name__} {a!r}, expected {type(e).__name__} {e!r}",
            )
    return None
