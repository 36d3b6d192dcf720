"""The TensorRT shell of collective_impl="plugin": TensorRT-LLM's plugins as layers, and
``IS_BUILDING=1`` while TensorRT builds.

    trtllm_layer(trt, ctx, x, call, dtype, name)   # one IPluginV2 layer (add_plugin_v2)
    is_building_during_builds()                    # once, at registration

Every field comes from ``spec.trtllm_plugin_spec`` (pure, tested). Not run against a real
TensorRT here (no TensorRT on this machine): the ``tensorrt``/``gpu`` tests exercise it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from torch_tensorrt_dist.conversion.impl.trtllm.loader import (
    load_trtllm_plugins,
    loaded_trtllm_plugins,
)
from torch_tensorrt_dist.conversion.impl.trtllm.spec import trtllm_plugin_spec
from torch_tensorrt_dist.conversion.node_args import CollectiveCall
from torch_tensorrt_dist.conversion.settings import plugin_path_setting
from torch_tensorrt_dist.errors import EngineUnavailableError, UnsupportedCollectiveError

__all__ = ["is_building_during_builds", "trtllm_layer"]


def _plugin_field_type(trt: Any, array: np.ndarray) -> Any:
    kinds = {
        np.dtype(np.int32): trt.PluginFieldType.INT32,
        np.dtype(np.int8): trt.PluginFieldType.INT8,
        np.dtype(np.float32): trt.PluginFieldType.FLOAT32,
    }
    return kinds[array.dtype]


def _plugin_layer(trt: Any, ctx: Any, x: Any, spec: Any, name: str) -> Any:
    registry = trt.get_plugin_registry()
    get = getattr(registry, "get_creator", None) or registry.get_plugin_creator
    creator = get(spec.name, spec.version, spec.namespace)
    if creator is None:
        raise EngineUnavailableError(
            f"no {spec.namespace}::{spec.name} v{spec.version} plugin creator is registered; "
            "load the TensorRT-LLM plugins first (settings plugin_path / TRTLLM_PLUGINS_PATH)"
        )
    fields = [
        trt.PluginField(key, value, _plugin_field_type(trt, value))
        for key, value in spec.fields.items()
    ]
    plugin = creator.create_plugin(name, trt.PluginFieldCollection(fields))
    if plugin is None:
        raise UnsupportedCollectiveError(f"{spec.name} plugin creation failed for {name}")
    return ctx.net.add_plugin_v2([x], plugin)


def trtllm_layer(trt: Any, ctx: Any, x: Any, call: CollectiveCall, dtype: Any, name: str) -> Any:
    """Add the TensorRT-LLM plugin layer for ``call`` on the ITensor ``x`` (loading the
    plugins from the settings' ``plugin_path`` first)."""
    load_trtllm_plugins(plugin_path_setting())
    return _plugin_layer(
        trt, ctx, x, trtllm_plugin_spec(call.op, dtype, call.group_ranks, call.reduce_op), name
    )


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def is_building_during_builds() -> None:
    """TensorRT-LLM's plugins skip their NCCL set-up while ``IS_BUILDING=1``. It must be set
    while TensorRT builds (the builder may time one rank's plugin alone, and the others would
    wait for it) and never while an engine is created to run (its plugins would then make no
    communicator). Torch-TensorRT builds in ``TRTInterpreter.run`` and creates the runtime
    engine after it returns, so that method (only) runs with the variable set, on every path
    (our engine and ``backend="torch_tensorrt"``), whenever the plugins are loaded."""
    from torch_tensorrt.dynamo.conversion._TRTInterpreter import TRTInterpreter

    build = TRTInterpreter.run
    if getattr(build, "_torch_tensorrt_dist", False):
        return

    @functools.wraps(build)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if loaded_trtllm_plugins() is None:
            return build(self, *args, **kwargs)
        with _environment("IS_BUILDING", "1"):
            return build(self, *args, **kwargs)

    run._torch_tensorrt_dist = True  # type: ignore[attr-defined]
    TRTInterpreter.run = run
