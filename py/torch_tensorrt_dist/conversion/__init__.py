"""TensorRT conversion of the typed collectives: a shared core, one folder per implementation.

    interface.py   what every implementation provides (CollectiveImpl) and the types it speaks
    impl/          native/, trtllm/, torch_nccl/: each its rules, spec, availability, emitter
    layers/        converters of other ops (the in-place KV-cache write)
    (the rest)     the core: the collective table, binding a node's arguments, the shared
                   rules, choosing the implementation, the validators and the one emitter,
                   registration with Torch-TensorRT, the engine build and communicator binding

Pure (no TensorRT import, tested on CPU): ``conversion_decision``, every implementation's
rules and spec (``trtllm_plugin_spec``, ``native_collective_spec``, ``torch_nccl_plugin_spec``),
``check_plugin_world``, the plugin library searches. The shell (``converters.py``,
``engine.py``, each ``impl/<folder>/emitter.py``) imports TensorRT only when it runs.
"""

from __future__ import annotations

from torch_tensorrt_dist.conversion.capability import conversion_decision, node_decision
from torch_tensorrt_dist.conversion.choice import (
    ENV_COLLECTIVE_IMPL,
    current_impl,
    requested_impl,
    select_impl,
)
from torch_tensorrt_dist.conversion.dtypes import TRT_DATA_TYPE, trt_data_type
from torch_tensorrt_dist.conversion.impl import IMPLEMENTATIONS, implementation
from torch_tensorrt_dist.conversion.impl.native.spec import (
    NativeCollectiveSpec,
    native_collective_spec,
)
from torch_tensorrt_dist.conversion.impl.torch_nccl.comms import (
    register_communicator,
    registered_communicators,
    unregister_communicator,
)
from torch_tensorrt_dist.conversion.impl.torch_nccl.library import load_torch_nccl_plugins
from torch_tensorrt_dist.conversion.impl.torch_nccl.spec import torch_nccl_plugin_spec
from torch_tensorrt_dist.conversion.impl.trtllm.loader import LoadedPlugins, load_trtllm_plugins
from torch_tensorrt_dist.conversion.impl.trtllm.mpi_world import (
    MpiWorld,
    check_plugin_world,
    mpi_world_from_env,
)
from torch_tensorrt_dist.conversion.impl.trtllm.spec import trtllm_plugin_spec
from torch_tensorrt_dist.conversion.interface import (
    CollectiveImpl,
    Decision,
    ImplChoice,
    PluginSpec,
)
from torch_tensorrt_dist.conversion.nccl_library import preload_torch_nccl
from torch_tensorrt_dist.conversion.registration import register_with_torch_tensorrt
from torch_tensorrt_dist.conversion.settings import collective_settings
from torch_tensorrt_dist.conversion.table import COLLECTIVES

__all__ = [
    "COLLECTIVES",
    "ENV_COLLECTIVE_IMPL",
    "IMPLEMENTATIONS",
    "TRT_DATA_TYPE",
    "CollectiveImpl",
    "Decision",
    "ImplChoice",
    "LoadedPlugins",
    "MpiWorld",
    "NativeCollectiveSpec",
    "PluginSpec",
    "check_plugin_world",
    "collective_settings",
    "conversion_decision",
    "current_impl",
    "implementation",
    "load_torch_nccl_plugins",
    "load_trtllm_plugins",
    "mpi_world_from_env",
    "native_collective_spec",
    "node_decision",
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
