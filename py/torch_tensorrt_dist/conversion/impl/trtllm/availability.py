"""Are the TensorRT-LLM plugins registered here? (loads them if needed; imports TensorRT lazily)"""

from __future__ import annotations

import importlib.util

from torch_tensorrt_dist.conversion.availability import PIP_INSTALL
from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError

__all__ = ["plugin_missing"]


def plugin_missing(plugin_path: str | None = None) -> str | None:
    """None if the TensorRT-LLM plugins are registered (loading them if needed), else why not."""
    if importlib.util.find_spec("tensorrt") is None:
        return f"TensorRT is not installed ({PIP_INSTALL})"
    from torch_tensorrt_dist.conversion.impl.trtllm.loader import load_trtllm_plugins

    try:
        load_trtllm_plugins(plugin_path)
    except (EngineUnavailableError, ConfigError) as exc:
        return str(exc)
    return None
