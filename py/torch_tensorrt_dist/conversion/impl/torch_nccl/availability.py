"""Can our plugins be used here? (TensorRT installed, our library built and loadable)"""

from __future__ import annotations

import importlib.util

from torch_tensorrt_dist.conversion.impl.torch_nccl.library import load_torch_nccl_plugins
from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError

__all__ = ["torch_nccl_missing"]


def torch_nccl_missing(path: str | None = None) -> str | None:
    """None if TensorRT is installed and our plugin library loads here, else why not (what
    ``collective_impl`` "auto" and "torch_nccl" consult)."""
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT is not installed (pip install 'torch_tensorrt_dist[tensorrt]')"
    try:
        load_torch_nccl_plugins(path)
    except (EngineUnavailableError, ConfigError) as exc:
        return str(exc)
    return None
