"""The TensorRT shell: one emitter for every collective, registered with Torch-TensorRT.

Each typed op gets one registry entry per implementation in ``table.IMPLS`` (native
DistCollective, TensorRT-LLM plugin, our torch_nccl plugin), all
high priority; a capability validator lets a node through only for the implementation chosen
now (``availability.current_impl``) and only if ``conversion_decision`` accepts it. A rejected
node stays in PyTorch, and the reason is logged. Everything numeric comes from ``spec.py``.

Nothing here has run against a real TensorRT in this repository's CI (no TensorRT there): the
``tensorrt``/``gpu`` tests exercise it where TensorRT is installed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch import fx

from torch_tensorrt_dist.conversion.availability import (
    bound_communicator_ranks,
    current_impl,
    native_members,
    plugin_path_setting,
)
from torch_tensorrt_dist.conversion.dtypes import TRT_DATA_TYPE
from torch_tensorrt_dist.conversion.mpi_world import check_plugin_world
from torch_tensorrt_dist.conversion.node_args import bind_collective, node_decision, row_of
from torch_tensorrt_dist.conversion.plugin_loader import load_trtllm_plugins
from torch_tensorrt_dist.conversion.spec import native_collective_spec, trtllm_plugin_spec
from torch_tensorrt_dist.conversion.table import IMPLS
from torch_tensorrt_dist.errors import (
    DistributedSetupError,
    EngineUnavailableError,
    UnsupportedCollectiveError,
)

__all__ = ["emit_collective", "make_validator", "register_converters"]

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def make_validator(impl: str) -> Callable[..., bool]:
    """Capability validator ``(node, compilation_settings) -> bool`` for one implementation."""

    def validate(node: fx.Node, compilation_settings: Any = None) -> bool:
        row = row_of(node.target)
        if row is None:
            return False
        try:
            call = bind_collective(row, node.args, node.kwargs)
        except UnsupportedCollectiveError as exc:
            _warn_once(f"{node.name}: {exc}", "%s stays in PyTorch: %s", node.name, exc)
            return False
        if len(call.group_ranks) == 1:
            # the identity: taken by the plugin row, which does not mark the engine multi-device
            return impl == "plugin"
        choice = current_impl()
        if choice.impl is None:
            _warn_once(choice.reason, "collectives stay in PyTorch: %s", choice.reason)
            return False
        if choice.impl != impl:
            return False
        comm = bound_communicator_ranks() if impl == "native" else None
        members = native_members() if impl == "native" else None
        ok, reason = node_decision(node, impl, comm_ranks=comm, native_members=members)
        if ok and impl == "plugin":
            try:
                check_plugin_world([call.group_ranks])
            except DistributedSetupError as exc:
                ok, reason = False, str(exc)
        if not ok:  # validators run more than once per node (partitioning, conversion)
            _warn_once(f"{node.name}: {reason}", "%s stays in PyTorch: %s", node.name, reason)
        return ok

    validate.__name__ = f"torch_tensorrt_dist_{impl}_collective_validator"
    return validate


def _torch_dtype(trt_dtype: Any) -> Any:
    number = int(trt_dtype)
    for torch_dtype, value in TRT_DATA_TYPE.items():
        if value == number:
            return torch_dtype
    raise UnsupportedCollectiveError(f"TensorRT data type {trt_dtype} has no torch counterpart")


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


def _native_layer(trt: Any, ctx: Any, x: Any, spec: Any, name: str) -> Any:
    layer = ctx.net.add_dist_collective(
        x,
        getattr(trt.CollectiveOperation, spec.collective_operation),
        getattr(trt.ReduceOperation, spec.reduce_operation),
        spec.root,
        spec.groups,
    )
    if layer is None:
        raise UnsupportedCollectiveError(f"TensorRT refused the DistCollective layer {name}")
    layer.num_ranks = spec.num_ranks
    return layer


def emit_collective(
    ctx: Any, target: Any, args: Sequence[Any], kwargs: dict[str, Any], name: str, *, impl: str
) -> Any:
    """Add the layer for one typed collective; returns its output ITensor."""
    import tensorrt as trt
    from torch_tensorrt.dynamo._SourceIR import SourceIR
    from torch_tensorrt.dynamo.conversion.converter_utils import get_trt_tensor, set_layer_name

    row = row_of(target)
    if row is None:
        raise UnsupportedCollectiveError(f"{target} is not a torch.ops.tensorrt_dist collective")
    call = bind_collective(row, args, kwargs)
    x = get_trt_tensor(ctx, args[0], f"{name}_input")
    if len(call.group_ranks) == 1:
        return x  # a group of one: the identity (TensorRT's layer rejects num_ranks=1 groups)
    dtype = _torch_dtype(x.dtype)
    if impl == "native":
        spec = native_collective_spec(
            call.op,
            dtype,
            call.group_ranks,
            call.reduce_op,
            call.src,
            comm_ranks=bound_communicator_ranks(),
            native_members=native_members(),
        )
        layer = _native_layer(trt, ctx, x, spec, name)
    elif impl == "torch_nccl":  # our csrc/ plugins on torch's NCCL communicators
        from torch_tensorrt_dist.conversion.torch_nccl_converter import torch_nccl_layer

        layer = torch_nccl_layer(trt, ctx, x, call, dtype, name)
    else:
        load_trtllm_plugins(plugin_path_setting())
        layer = _plugin_layer(
            trt, ctx, x, trtllm_plugin_spec(call.op, dtype, call.group_ranks, call.reduce_op), name
        )
    set_layer_name(layer, target, name, SourceIR.ATEN)
    return layer.get_output(0)


def _converter(impl: str) -> Callable[..., Any]:
    def convert(ctx: Any, target: Any, args: Any, kwargs: Any, name: str) -> Any:
        return emit_collective(ctx, target, args, kwargs, name, impl=impl)

    convert.__name__ = f"torch_tensorrt_dist_{impl}_collective"
    return convert


def register_converters() -> None:
    """Register both implementations of every typed collective with Torch-TensorRT, the
    in-place KV-cache write (``kv_cache.py``) and the MoE experts layer (``moe_experts.py``)."""
    import torch
    from torch_tensorrt.dynamo.conversion._ConverterRegistry import (
        ConverterPriority,
        dynamo_tensorrt_converter,
    )

    from torch_tensorrt_dist.conversion.kv_cache import (
        convert_kv_cache_write,
        kv_cache_write_validator,
    )
    from torch_tensorrt_dist.conversion.moe_experts import (
        convert_moe_experts,
        moe_experts_validator,
    )
    from torch_tensorrt_dist.ops.collectives import COLLECTIVE_OPS
    from torch_tensorrt_dist.ops.experts import EXPERTS_OP

    # before Torch-TensorRT's own index_copy converters (batch 1 only): any batch
    dynamo_tensorrt_converter(
        torch.ops.aten.index_copy.default,
        capability_validator=kv_cache_write_validator,
        priority=ConverterPriority.HIGH,
        supports_dynamic_shapes=False,
    )(convert_kv_cache_write)
    dynamo_tensorrt_converter(
        EXPERTS_OP, capability_validator=moe_experts_validator, supports_dynamic_shapes=False
    )(convert_moe_experts)
    for overload in COLLECTIVE_OPS.values():
        for impl in IMPLS:
            dynamo_tensorrt_converter(
                overload,
                capability_validator=make_validator(impl),
                priority=ConverterPriority.HIGH,
                supports_dynamic_shapes=True,
                requires_native_multidevice=impl == "native",
            )(_converter(impl))
