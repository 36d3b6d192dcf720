"""torch_tensorrt_dist: tensor- and pipeline-parallel inference for Torch-TensorRT.

``import torch_tensorrt_dist`` registers the typed collective ops (``torch.ops.tensorrt_dist``)
and makes the Dynamo backend ``"torch_tensorrt_dist"`` available (an entry point when the
package is installed, see ``_registration``); where Torch-TensorRT is installed it also
registers our lowering pass and converters with it. Nothing here needs a GPU or TensorRT, and
Dynamo itself is imported only when something compiles (``explain`` and ``CompileSettings``
load on first use).
"""

from __future__ import annotations

from typing import Any

from torch_tensorrt_dist import ops  # registers torch.ops.tensorrt_dist.*
from torch_tensorrt_dist._registration import backend_entry_point_installed
from torch_tensorrt_dist._version import __version__
from torch_tensorrt_dist.errors import (
    ConfigError,
    DistributedSetupError,
    EngineUnavailableError,
    GroupResolutionError,
    ScheduleMismatchError,
    TensorRTDistError,
    UnsupportedCollectiveError,
    VerificationError,
)
from torch_tensorrt_dist.lowering import fuse_collectives
from torch_tensorrt_dist.runtime import init_distributed

__all__ = [
    "CompileSettings",
    "ConfigError",
    "DistributedSetupError",
    "EngineUnavailableError",
    "ExplainReport",
    "GroupResolutionError",
    "ScheduleMismatchError",
    "TensorRTDistError",
    "UnsupportedCollectiveError",
    "VerificationError",
    "__version__",
    "compile_blocks",
    "explain",
    "fuse_collectives",
    "init_distributed",
    "ops",
]

_LAZY = {
    "CompileSettings": "torch_tensorrt_dist.backend.settings",
    "compile_blocks": "torch_tensorrt_dist.backend.blocks",
    "ExplainReport": "torch_tensorrt_dist.backend.explain",
    "explain": "torch_tensorrt_dist.backend.explain",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torch_tensorrt_dist' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


if not backend_entry_point_installed():  # a source tree: register the backend now
    import torch_tensorrt_dist.backend

# --- integrations (one line each) ---
import torch_tensorrt_dist.conversion._autoregister  # noqa: F401, E402  (Torch-TensorRT hook)
