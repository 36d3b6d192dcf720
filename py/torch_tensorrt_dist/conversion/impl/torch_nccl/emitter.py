"""The TensorRT shell of collective_impl="torch_nccl": our plugins (``csrc/``) as layers.

    prepare_torch_nccl(calls)   # before building: library into TensorRT, communicators in
    torch_nccl_layer(trt, ctx, x, call, dtype, name)   # one IPluginV3 layer (add_plugin_v3)

Every field comes from ``spec.torch_nccl_plugin_spec`` (pure, tested); the layer
is created in TensorRT's build phase, so building makes no NCCL call. Not run against a real
TensorRT here (no TensorRT on this machine): the ``tensorrt``/``gpu`` tests exercise it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from torch_tensorrt_dist.conversion.impl.torch_nccl.library import load_torch_nccl_plugins
from torch_tensorrt_dist.conversion.impl.torch_nccl.spec import torch_nccl_plugin_spec
from torch_tensorrt_dist.conversion.node_args import CollectiveCall
from torch_tensorrt_dist.errors import EngineUnavailableError, UnsupportedCollectiveError

__all__ = ["load_into_tensorrt", "prepare_torch_nccl", "torch_nccl_layer"]

logger = logging.getLogger(__name__)
_lock = threading.Lock()
_in_tensorrt: dict[str, Any] = {}


def load_into_tensorrt(trt: Any) -> str:
    """Load our library into TensorRT's plugin registry once (``IPluginRegistry::loadLibrary``:
    TensorRT calls its ``setLoggerFinder`` and ``getCreators``); returns its path."""
    plugins = load_torch_nccl_plugins()
    with _lock:
        if plugins.path not in _in_tensorrt:
            handle = trt.get_plugin_registry().load_library(plugins.path)
            if handle is None:
                raise EngineUnavailableError(f"TensorRT could not load {plugins.path}")
            _in_tensorrt[plugins.path] = handle
            logger.debug("TensorRT loaded %s", plugins.path)
    return plugins.path


def prepare_torch_nccl(calls: Sequence[CollectiveCall]) -> list[tuple[int, ...]]:
    """Before an engine is built: load the library into TensorRT and register the NCCL
    communicator of each group the engine's collectives use (in graph order, so every rank
    of a group registers it at the same point). Returns the registered groups' ranks."""
    import tensorrt as trt

    from torch_tensorrt_dist.conversion.impl.torch_nccl.comms import register_communicator
    from torch_tensorrt_dist.ops.groups import resolve_group

    load_into_tensorrt(trt)
    done: list[tuple[int, ...]] = []
    for call in calls:
        if len(call.group_ranks) > 1 and call.group_ranks not in done:
            ranks = register_communicator(resolve_group(call.group_name))
            if ranks != call.group_ranks:
                raise EngineUnavailableError(
                    f"group {call.group_name!r} resolves to ranks {list(ranks)}, but the graph "
                    f"records {list(call.group_ranks)}"
                )
            done.append(ranks)
    return done


def _ensure_communicator(call: CollectiveCall) -> None:
    """Register the group's communicator if nothing has (``backend="torch_tensorrt"`` has no
    ``prepare_torch_nccl`` step); every rank of the group converts this layer, so the
    registering all_reduce is matched."""
    if load_torch_nccl_plugins().lookup(call.group_ranks) is None:
        from torch_tensorrt_dist.conversion.impl.torch_nccl.comms import register_communicator
        from torch_tensorrt_dist.ops.groups import resolve_group

        register_communicator(resolve_group(call.group_name))


def torch_nccl_layer(
    trt: Any, ctx: Any, x: Any, call: CollectiveCall, dtype: Any, name: str
) -> Any:
    """Add our plugin layer for ``call`` on the ITensor ``x`` (``dtype``: its torch dtype)."""
    load_into_tensorrt(trt)
    _ensure_communicator(call)
    spec = torch_nccl_plugin_spec(
        call.op, dtype, call.group_ranks, call.reduce_op, call.src, dim0=call.dim0
    )
    creator = trt.get_plugin_registry().get_creator(spec.name, spec.version, spec.namespace)
    if creator is None:
        raise EngineUnavailableError(
            f"no {spec.namespace}::{spec.name} v{spec.version} creator is registered after "
            "loading our plugin library; rebuild it with `torchtrt-dist build-plugins`"
        )
    fields = [
        trt.PluginField(key, value, trt.PluginFieldType.INT32) for key, value in spec.fields.items()
    ]
    plugin = creator.create_plugin(name, trt.PluginFieldCollection(fields), trt.TensorRTPhase.BUILD)
    if plugin is None:
        raise UnsupportedCollectiveError(f"{spec.name} plugin creation failed for {name}")
    return ctx.net.add_plugin_v3([x], [], plugin)
