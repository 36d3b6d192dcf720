"""KV-cache writes as TensorRT's in-place KV-cache update layer, for any batch.

The Llama decode step writes each cache with ``index_copy(<cache input>, 2, cache_pos, k)``
(all rows at once, ``models/llama.py``). Torch-TensorRT 2.14 turns that into an
``IKVCacheUpdateLayer`` whose output aliases the cache input (no copy), but only for batch 1;
any other batch goes through a scatter that rebuilds the whole cache. Our converter takes the
same layer for every batch: TensorRT writes ``S`` slots starting at ``writeIndices[b]`` in row
``b``, so ``writeIndices`` is ``cache_pos[0]`` repeated per row. That is only the same write as
``index_copy`` when the ``S`` positions are consecutive, which holds for one slot (decode); a
prefill (several slots at positions given as an input, or an ``arange`` that Torch-TensorRT's
constant folding turns into a constant) stays with Torch-TensorRT's own converters (correct,
slower, once per request). TensorRT writes the cache in place, so the write must be the
cache's only reader in the graph (any other reader would see the new values) and the cache
must not be a graph output itself.

:func:`kv_cache_write_decision` is pure (FX metadata only) and tested on CPU;
:func:`convert_kv_cache_write` is the TensorRT shell, run only where TensorRT is installed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.conversion.interface import Decision

__all__ = ["convert_kv_cache_write", "kv_cache_write_decision", "kv_cache_write_validator"]

_aten = torch.ops.aten
_ARANGES = (_aten.arange.default, _aten.arange.start, _aten.arange.start_step)
#: dtypes IKVCacheUpdateLayer takes for the cache (NvInfer.h: kFLOAT, kHALF, kBF16)
_CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _static_shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    shape = tuple(val.shape)
    return tuple(int(s) for s in shape) if all(isinstance(s, int) for s in shape) else None


def _consecutive(index: Any) -> bool:
    """Positions made in the graph by ``arange`` with step 1 (so they are consecutive)."""
    if not isinstance(index, fx.Node) or index.target not in _ARANGES:
        return False
    step = index.args[2] if index.target is _aten.arange.start_step else 1
    return isinstance(step, int) and step == 1


def kv_cache_write_decision(node: fx.Node) -> Decision:
    """Can this ``aten.index_copy`` become TensorRT's in-place KV-cache update layer?"""
    if node.target is not _aten.index_copy.default or len(node.args) < 4:
        return Decision(False, f"{node.format_node()} is not aten.index_copy.default")
    if node.meta.get("_trt_no_kv_alias"):
        return Decision(False, "Torch-TensorRT filed this write as copy-back (_trt_no_kv_alias)")
    cache, dim, index, src = node.args[:4]
    if not isinstance(cache, fx.Node) or cache.op != "placeholder":
        return Decision(False, "the cache written is not a graph input (a view of one, say)")
    if len(cache.users) != 1 or any(u.op == "output" for u in cache.users):
        return Decision(
            False, "the cache has other readers in the graph, which an in-place write would change"
        )
    index_shape = _static_shape(index)
    if index_shape is None or len(index_shape) != 1:
        return Decision(False, "the positions are not a 1-D tensor of static length")
    cache_shape, src_shape = _static_shape(cache), _static_shape(src)
    if cache_shape is None or src_shape is None or len(cache_shape) != 4 or len(src_shape) != 4:
        return Decision(False, "cache and update must be 4-D with static shapes [B, H, L, D]")
    if dim not in (2, -2):
        return Decision(False, f"the write is along dim {dim}, not the sequence dim 2")
    if (src_shape[0], src_shape[1], src_shape[3]) != (
        cache_shape[0],
        cache_shape[1],
        cache_shape[3],
    ):
        return Decision(
            False, f"update {list(src_shape)} does not fill every row of cache {list(cache_shape)}"
        )
    dtype = cache.meta["val"].dtype
    if dtype != src.meta["val"].dtype:  # type: ignore[union-attr]
        return Decision(False, "cache and update have different dtypes")
    if dtype not in _CACHE_DTYPES:
        return Decision(False, f"TensorRT's KV-cache layer takes float caches, not {dtype}")
    slots = src_shape[2]
    if slots != 1 and not _consecutive(index):
        return Decision(
            False,
            f"a write of {slots} slots at positions that are not an in-graph arange: not "
            "provably consecutive",
        )
    return Decision(
        True,
        f"in-place KV-cache update of {cache_shape[0]} row(s), {slots} slot(s) from cache_pos[0]",
    )


def kv_cache_write_validator(node: fx.Node, compilation_settings: Any = None) -> bool:
    """Torch-TensorRT capability validator ``(node, settings) -> bool``."""
    return kv_cache_write_decision(node).convertible


def convert_kv_cache_write(ctx: Any, target: Any, args: Any, kwargs: Any, name: str) -> Any:
    """Emit ``IKVCacheUpdateLayer`` with ``writeIndices = cache_pos[0]`` per row (TensorRT)."""
    import tensorrt as trt
    from torch_tensorrt.dynamo._SourceIR import SourceIR
    from torch_tensorrt.dynamo.conversion.converter_utils import cast_trt_tensor, get_trt_tensor
    from torch_tensorrt.dynamo.conversion.impl.index_copy import index_copy_fallback
    from torch_tensorrt.dynamo.conversion.impl.slice_scatter import emit_kv_cache_update_layer

    cache, dim, index, src = args[:4]
    dim = dim % 4  # the validator took 2 or -2; the fallback needs it non-negative
    cache = get_trt_tensor(ctx, cache, f"{name}_cache")
    src = get_trt_tensor(ctx, src, f"{name}_src")
    index = get_trt_tensor(ctx, index, f"{name}_index")
    positions = cast_trt_tensor(ctx, index, trt.int32, f"{name}_index_int32")
    batch = int(cache.shape[0])
    # [S] -> [B]: element 0 repeated (a stride-0 slice), the first slot of every row
    first = ctx.net.add_slice(positions, start=(0,), shape=(batch,), stride=(0,))
    out = emit_kv_cache_update_layer(ctx, name, cache, src, first.get_output(0))
    if out is None:  # the cache is not a network input after all: the general, correct path
        return index_copy_fallback(ctx, target, SourceIR.ATEN, name, cache, dim, index, src)
    return out
