"""The Dynamo backend ``torch_tensorrt_dist``, its settings, engines and reports."""

from torch_tensorrt_dist._registration import backend_entry_point_installed
from torch_tensorrt_dist.backend.backend import (
    BACKEND_NAME,
    lower_graph,
    recording,
    torch_tensorrt_dist_backend,
)
from torch_tensorrt_dist.backend.report import CollectiveInfo, GraphReport, collectives_in
from torch_tensorrt_dist.backend.settings import CompileSettings

if not backend_entry_point_installed():  # else Dynamo loads the entry point when looked up
    from torch._dynamo import register_backend

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
