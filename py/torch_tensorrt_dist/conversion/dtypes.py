"""Tensor dtypes as TensorRT numbers them (``nvinfer1::DataType``). Pure: no TensorRT import.
Which dtypes an implementation takes is in its own ``impl/<folder>/rules.py``.

``nvinfer1::DataType`` (NvInferRuntimeBase.h, TensorRT 10 and 11; TensorRT-LLM mirrors it in
``tensorrt_llm::DataType``): kFLOAT 0, kHALF 1, kINT8 2, kINT32 3, kBOOL 4, kUINT8 5, kFP8 6,
kBF16 7, kINT64 8, kINT4 9, kFP4 10, kE8M0 11. The TensorRT-LLM plugins take this number in
their ``type_id`` field.
"""

from __future__ import annotations

import torch

from torch_tensorrt_dist.errors import UnsupportedCollectiveError

__all__ = [
    "TRT_DATA_TYPE",
    "as_torch_dtype",
    "dtype_name",
    "trt_data_type",
]

#: torch dtype -> nvinfer1::DataType value (only dtypes with a TensorRT counterpart)
TRT_DATA_TYPE: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.float16: 1,
    torch.int8: 2,
    torch.int32: 3,
    torch.bool: 4,
    torch.uint8: 5,
    torch.float8_e4m3fn: 6,
    torch.bfloat16: 7,
    torch.int64: 8,
}

_ALIASES = {
    "fp32": torch.float32,
    "float": torch.float32,
    "fp16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
}


def as_torch_dtype(dtype: object) -> torch.dtype:
    """``torch.float16``, ``"float16"``, ``"torch.float16"``, ``"fp16"`` -> ``torch.float16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        if name in _ALIASES:
            return _ALIASES[name]
        candidate = getattr(torch, name, None)
        if isinstance(candidate, torch.dtype):
            return candidate
    raise UnsupportedCollectiveError(
        f"{dtype!r} is not a torch dtype; pass e.g. torch.float16 or 'float16'"
    )


def trt_data_type(dtype: object) -> int:
    """The ``nvinfer1::DataType`` value of a torch dtype (what a plugin's ``type_id`` holds)."""
    torch_dtype = as_torch_dtype(dtype)
    if torch_dtype not in TRT_DATA_TYPE:
        known = ", ".join(dtype_name(d) for d in TRT_DATA_TYPE)
        raise UnsupportedCollectiveError(
            f"TensorRT has no data type for {dtype_name(torch_dtype)}; cast to one of {known}"
        )
    return TRT_DATA_TYPE[torch_dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
