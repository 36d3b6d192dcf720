"""The Dynamo backend ``torch_tensorrt_dist``, its settings, engines and reports."""

from torch._dynamo import register_backend

from torch_tensorrt_dist.backend.backend import (
    BACKEND_NAME,
    lower_graph,
    recording,
    torch_tensorrt_dist_backend,
)
from torch_tensorrt_dist.backend.report import CollectiveInfo, GraphReport, collectives_in
from torch_tensorrt_dist.backend.settings import CompileSettings

register_backend(name=BACKEND_NAME)(torch_tensorrt_dist_backend)

__all__ = [
    "BACKEND_NAME",
    "CollectiveInfo",
    "CompileSettings",
    "GraphReport",
    "collectives_in",
    "lower_graph",
    "recording",
    "torch_tensorrt_dist_backend",
]
