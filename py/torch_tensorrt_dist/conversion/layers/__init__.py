"""TensorRT converters of the ops that are not collectives, one module each, one row each in
:data:`LAYERS` (registered at high priority by ``converters.register_converters``).

    kv_cache.py       aten.index_copy (a shared-position KV-cache write) -> IKVCacheUpdateLayer,
                      in place, for any batch
    gather.py         aten.gather with dynamic shapes -> IGatherLayer (ELEMENT); Torch-TensorRT's
                      own converter takes static shapes only
    weight_only.py    aten._weight_int8pack_mm / tensorrt_dist.int4_weight_only_mm (quantized
                      linears) -> IDequantizeLayer on constant INT8 / INT4 weights -> matmul
    moe_experts.py    tensorrt_dist.moe_experts (the grouped MoE experts) -> IMoELayer, where
                      TensorRT and the GPU have it; else the op stays in PyTorch

The paged KV cache's block writes have no converter: ``paged_kv.py`` keeps them in PyTorch, in
place (a lowering pass, ``registration.py``), and ``paged_forms.py`` says what the block reads
and the attention become (``explain``).

A new one (a quantized linear, a grouped matmul, ...) is a module here with a pure
``<what>_decision(node) -> Decision`` (FX metadata only, tested on CPU), the validator and the
converter around it, and a row below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torch_tensorrt_dist.conversion.layers.gather import convert_gather, gather_validator
from torch_tensorrt_dist.conversion.layers.kv_cache import (
    convert_kv_cache_write,
    kv_cache_write_validator,
)
from torch_tensorrt_dist.conversion.layers.moe_experts import (
    convert_moe_experts,
    moe_experts_validator,
)
from torch_tensorrt_dist.conversion.layers.weight_only import (
    INT4_OP,
    INT8_OP,
    convert_weight_only,
    weight_only_validator,
)
from torch_tensorrt_dist.ops.experts import EXPERTS_OP

__all__ = ["LAYERS", "LayerConverter"]


@dataclass(frozen=True)
class LayerConverter:
    """One Torch-TensorRT converter registration: ``dynamo_tensorrt_converter(target,
    capability_validator=validator, priority=HIGH, supports_dynamic_shapes=...)(convert)``."""

    target: Any  # the OpOverload it converts
    validator: Callable[..., bool]  # (node, compilation_settings) -> bool
    convert: Callable[..., Any]  # (ctx, target, args, kwargs, name) -> ITensor
    supports_dynamic_shapes: bool


LAYERS: tuple[LayerConverter, ...] = (
    # before Torch-TensorRT's own index_copy converters (batch 1 only): any batch
    LayerConverter(
        torch.ops.aten.index_copy.default,
        kv_cache_write_validator,
        convert_kv_cache_write,
        supports_dynamic_shapes=False,
    ),
    # Torch-TensorRT's own gather converter declares static shapes only; the body does not care
    LayerConverter(
        torch.ops.aten.gather.default,
        gather_validator,
        convert_gather,
        supports_dynamic_shapes=True,
    ),
    # weight-only quantized linears (quantization/): dequantize constant codes into the matmul;
    # M (the tokens) may be dynamic: the constant is [K, N], the matmul takes any M
    LayerConverter(INT8_OP, weight_only_validator, convert_weight_only, True),
    LayerConverter(INT4_OP, weight_only_validator, convert_weight_only, True),
    # T (the tokens) may be dynamic: every reshape keeps one -1 (moe_experts.py)
    LayerConverter(
        EXPERTS_OP, moe_experts_validator, convert_moe_experts, supports_dynamic_shapes=True
    ),
)
