"""torch_tensorrt_dist: tensor- and pipeline-parallel inference for Torch-TensorRT.

``import torch_tensorrt_dist`` registers the typed collective ops (``torch.ops.tensorrt_dist``)
and the Dynamo backend ``"torch_tensorrt_dist"``; where Torch-TensorRT is installed it also
registers our lowering pass and converters with it. Nothing here needs a GPU or TensorRT.
"""

from __future__ import annotations

from torch_tensorrt_dist import ops  # registers torch.ops.tensorrt_dist.*
from torch_tensorrt_dist._version import __version__
from torch_tensorrt_dist.backend import CompileSettings
from torch_tensorrt_dist.backend.explain import ExplainReport, explain
from torch_tensorrt_dist.errors import (
    ConfigError,
    DistributedSetupError,
    EngineUnavailableError,
    GroupResolutionError,
    ScheduleMismatchError,
    TensorRTDistError,
    UnsupportedCollectiveError,
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
    "__version__",
    "explain",
    "fuse_collectives",
    "init_distributed",
    "ops",
]

# --- integrations (one line each) ---
import torch_tensorrt_dist.conversion._autoregister  # noqa: F401  (Torch-TensorRT hook)
