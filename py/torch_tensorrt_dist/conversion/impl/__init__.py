"""The TensorRT implementations of a collective layer, one folder each, registered here.

    native/       TensorRT DistCollective (collective_impl="native")
    trtllm/       TensorRT-LLM's NCCL plugins (collective_impl="plugin")
    torch_nccl/   our plugins (csrc/) on torch's NCCL communicators (collective_impl="torch_nccl")

Each folder's ``__init__.py`` fills in ``interface.CollectiveImpl``; a new implementation is a
new folder and its entry below. The order here is the order of ``explain``'s TensorRT column,
of the converters registered with Torch-TensorRT, and of the reasons when none is usable.
"""

from __future__ import annotations

from torch_tensorrt_dist.conversion.impl.native import NATIVE
from torch_tensorrt_dist.conversion.impl.torch_nccl import TORCH_NCCL
from torch_tensorrt_dist.conversion.impl.trtllm import TRTLLM
from torch_tensorrt_dist.conversion.interface import CollectiveImpl

__all__ = ["IMPLEMENTATIONS", "implementation", "implementations"]

IMPLEMENTATIONS: tuple[CollectiveImpl, ...] = (NATIVE, TRTLLM, TORCH_NCCL)


def implementations() -> tuple[CollectiveImpl, ...]:
    """The registered implementations, in order (the core reads them here, at each call)."""
    return IMPLEMENTATIONS


def implementation(name: str) -> CollectiveImpl | None:
    """The registered implementation called ``name`` (its ``collective_impl`` value), or None."""
    return next((impl for impl in implementations() if impl.name == name), None)
