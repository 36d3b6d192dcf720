"""The names of the weight dtypes, as the CLI (``--dtype``) and the artifact manifests write
them."""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "dtype_name"]

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str | None:
    """The name of ``dtype`` (None for a dtype the weights are never held in)."""
    return next((name for name, d in DTYPES.items() if d == dtype), None)
