"""Can native DistCollective layers be built and bound here? (imports TensorRT lazily)"""

from __future__ import annotations

import functools
import importlib.util

from torch_tensorrt_dist.conversion.availability import PIP_INSTALL, first_line

__all__ = ["native_members", "native_missing"]


@functools.lru_cache(maxsize=1)
def native_members() -> frozenset[str] | None:
    """``CollectiveOperation.X`` / ``ReduceOperation.X`` members the installed TensorRT has
    (ALL_TO_ALL only from 11.0); None where TensorRT cannot be imported (nothing to check)."""
    if importlib.util.find_spec("tensorrt") is None:
        return None
    try:
        import tensorrt as trt
    except Exception:
        return None
    members: set[str] = set()
    for enum in ("CollectiveOperation", "ReduceOperation"):
        values = getattr(trt, enum, None)
        if values is not None:
            members.update(f"{enum}.{m}" for m in dir(values) if m.isupper())
    return frozenset(members)


@functools.lru_cache(maxsize=1)
def native_missing() -> str | None:
    """None if native DistCollective layers can be built and bound here, else why not."""
    if importlib.util.find_spec("tensorrt") is None:
        return f"TensorRT is not installed ({PIP_INSTALL})"
    try:
        import tensorrt as trt
    except Exception as exc:
        return f"TensorRT cannot be imported ({first_line(exc)})"
    if not hasattr(trt.INetworkDefinition, "add_dist_collective"):
        return f"TensorRT {trt.__version__} has no DistCollective layer (needs TensorRT >= 10.16)"
    if importlib.util.find_spec("torch_tensorrt") is None:
        return f"Torch-TensorRT is not installed ({PIP_INSTALL})"
    try:
        from torch_tensorrt._features import ENABLED_FEATURES
    except Exception as exc:  # a bare Exception where libnvinfer is missing
        return f"Torch-TensorRT cannot be imported ({first_line(exc)})"
    if not getattr(ENABLED_FEATURES, "native_trt_collectives", False):
        return (
            "the installed Torch-TensorRT runtime was built without NCCL collectives "
            "(ENABLED_FEATURES.native_trt_collectives is False), so it cannot bind a "
            "communicator to an engine"
        )
    return None
