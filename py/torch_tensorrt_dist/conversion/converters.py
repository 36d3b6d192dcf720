"""The TensorRT shell: one emitter for every collective, registered with Torch-TensorRT.

Each typed op gets one registry entry per registered implementation (``impl/__init__.py``:
native DistCollective, TensorRT-LLM plugin, our torch_nccl plugin), all high priority; a
capability validator lets a node through only for the implementation chosen now
(``choice.current_impl``) and only if ``conversion_decision`` accepts it. A rejected node stays
in PyTorch, and the reason is logged. The layer itself is the implementation's ``emit``, every
number in it from its pure ``spec``. The converters of other ops are in ``layers/``.

Nothing here has run against a real TensorRT in this repository's CI (no TensorRT there): the
``tensorrt``/``gpu`` tests exercise it where TensorRT is installed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from torch_tensorrt_dist.conversion.capability import node_decision
from torch_tensorrt_dist.conversion.choice import current_impl
from torch_tensorrt_dist.conversion.dtypes import TRT_DATA_TYPE
from torch_tensorrt_dist.conversion.engine_binding import bound_communicator_ranks
from torch_tensorrt_dist.conversion.impl import implementation, implementations
from torch_tensorrt_dist.conversion.interface import CollectiveImpl
from torch_tensorrt_dist.conversion.node_args import bind_collective, row_of
from torch_tensorrt_dist.errors import DistributedSetupError, UnsupportedCollectiveError

__all__ = ["emit_collective", "make_validator", "register_converters"]

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def _registered(impl: str) -> CollectiveImpl:
    found = implementation(impl)
    if found is None:
        raise UnsupportedCollectiveError(f"no collective implementation {impl!r} is registered")
    return found


def _identity_impl() -> str:
    """The implementation whose converter takes a group of one (the identity): the first that
    does not mark the engine multi-device."""
    return next(i.name for i in implementations() if not i.one_communicator_per_engine)


def make_validator(impl: str) -> Callable[..., bool]:
    """Capability validator ``(node, compilation_settings) -> bool`` for one implementation."""
    found = _registered(impl)

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
            # the identity: taken by a row that does not mark the engine multi-device
            return impl == _identity_impl()
        choice = current_impl()
        if choice.impl is None:
            _warn_once(choice.reason, "collectives stay in PyTorch: %s", choice.reason)
            return False
        if choice.impl != impl:
            return False
        comm = bound_communicator_ranks() if found.one_communicator_per_engine else None
        ok, reason = node_decision(node, impl, **found.facts(comm))
        if ok:
            try:
                found.check_launch([call.group_ranks])
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
    layer = _registered(impl).emit(trt, ctx, x, call, dtype, name)
    set_layer_name(layer, target, name, SourceIR.ATEN)
    return layer.get_output(0)


def _converter(impl: str) -> Callable[..., Any]:
    def convert(ctx: Any, target: Any, args: Any, kwargs: Any, name: str) -> Any:
        return emit_collective(ctx, target, args, kwargs, name, impl=impl)

    convert.__name__ = f"torch_tensorrt_dist_{impl}_collective"
    return convert


def register_converters() -> None:
    """Register every implementation of every typed collective with Torch-TensorRT, and the
    converters of other ops (``layers/``)."""
    from torch_tensorrt.dynamo.conversion._ConverterRegistry import (
        ConverterPriority,
        dynamo_tensorrt_converter,
    )

    from torch_tensorrt_dist.conversion.layers import LAYERS
    from torch_tensorrt_dist.ops.collectives import COLLECTIVE_OPS

    for layer in LAYERS:
        dynamo_tensorrt_converter(
            layer.target,
            capability_validator=layer.validator,
            priority=ConverterPriority.HIGH,
            supports_dynamic_shapes=layer.supports_dynamic_shapes,
        )(layer.convert)
    for overload in COLLECTIVE_OPS.values():
        for impl in implementations():
            dynamo_tensorrt_converter(
                overload,
                capability_validator=make_validator(impl.name),
                priority=ConverterPriority.HIGH,
                supports_dynamic_shapes=True,
                requires_native_multidevice=impl.one_communicator_per_engine,
            )(_converter(impl.name))
