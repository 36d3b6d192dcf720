"""TensorRT conversion of the typed collectives: pure spec code plus a thin TensorRT shell.

Pure (no TensorRT import, tested on CPU): ``trtllm_plugin_spec``, ``native_collective_spec``,
``torch_nccl_plugin_spec``, ``conversion_decision``, ``check_plugin_world``, the plugin
library searches. The shell
(``converters.py``, ``engine.py``) imports TensorRT only when it runs.
"""

from __future__ import annotations

from torch_tensorrt_dist.conversion.capability import (
    ENV_COLLECTIVE_IMPL,
    Decision,
    ImplChoice,
    conversion_decision,
    requested_impl,
    select_impl,
)
from torch_tensorrt_dist.conversion.dtypes import TRT_DATA_TYPE, trt_data_type
from torch_tensorrt_dist.conversion.mpi_world import (
    MpiWorld,
    check_plugin_world,
    mpi_world_from_env,
)
from torch_tensorrt_dist.conversion.nccl_library import preload_torch_nccl
from torch_tensorrt_dist.conversion.plugin_loader import LoadedPlugins, load_trtllm_plugins
from torch_tensorrt_dist.conversion.registration import register_with_torch_tensorrt
from torch_tensorrt_dist.conversion.spec import (
    NativeCollectiveSpec,
    PluginSpec,
    native_collective_spec,
    trtllm_plugin_spec,
)
from torch_tensorrt_dist.conversion.table import COLLECTIVES
from torch_tensorrt_dist.conversion.torch_nccl_comms import (
    register_communicator,
    registered_communicators,
    unregister_communicator,
)
from torch_tensorrt_dist.conversion.torch_nccl_plugins import load_torch_nccl_plugins
from torch_tensorrt_dist.conversion.torch_nccl_spec import torch_nccl_plugin_spec

__all__ = [
    "COLLECTIVES",
    "ENV_COLLECTIVE_IMPL",
    "TRT_DATA_TYPE",
    "Decision",
    "ImplChoice",
    "LoadedPlugins",
    "MpiWorld",
    "NativeCollectiveSpec",
    "PluginSpec",
    "check_plugin_world",
    "conversion_decision",
    "load_torch_nccl_plugins",
    "load_trtllm_plugins",
    "mpi_world_from_env",
    "native_collective_spec",
    "preload_torch_nccl",
    "register_communicator",
    "register_with_torch_tensorrt",
    "registered_communicators",
    "requested_impl",
    "select_impl",
    "torch_nccl_plugin_spec",
    "trt_data_type",
    "trtllm_plugin_spec",
    "unregister_communicator",
]
