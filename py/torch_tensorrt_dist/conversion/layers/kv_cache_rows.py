"""The generation core's KV-cache writes as TensorRT's in-place KV-cache update layer.

The serving graphs (``models/llama.py``: ``decode_rows``, ``prefill_slot``) write each cache with
``index_put`` into the cache input, in one of two forms:

* **rows** (decode): ``cache[arange(B), :, pos] = v`` with ``pos [B]`` (every row at its own
  position), ``v [B, H, D]``. That is exactly ``IKVCacheUpdateLayer`` with ``update =
  v[:, :, None]`` ``[B, H, 1, D]`` and ``writeIndices = pos``: TensorRT writes row ``b`` at
  ``pos[b]``, in place.
* **slot** (prefill): ``cache[slot.expand(S), :, arange(S)] = v`` with ``v [S, H, D]`` (one
  row's positions ``[0, S)``). The layer's update has every row of the cache, so the write goes
  in the packed form (``AttentionIOForm.PACKED_NHD``, TensorRT 11): ``update = v`` is
  ``[total_tokens, H, D]`` and ``update_lengths [B + 1]`` (cumulative) gives ``S`` tokens to
  row ``slot`` and none to the others, with ``writeIndices`` all 0.

As for ``index_copy`` (``kv_cache.py``), the write must be the cache's only reader and the cache
must not be a graph output: TensorRT writes it in place. The row and slot indices may be
``arange`` nodes or the constants Torch-TensorRT folds them into.

:func:`kv_cache_put_form` is pure (FX metadata only) and tested on CPU;
:func:`convert_kv_cache_put` is the TensorRT shell, run only where TensorRT is installed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import fx

from torch_tensorrt_dist.conversion.interface import Decision

__all__ = [
    "KVPut",
    "convert_kv_cache_put",
    "kv_cache_put_decision",
    "kv_cache_put_form",
    "kv_cache_put_validator",
]

_aten = torch.ops.aten
_ARANGES = (_aten.arange.default, _aten.arange.start, _aten.arange.start_step)
_CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class KVPut(NamedTuple):
    """The form of an ``index_put`` into a KV cache (``rows``, ``slot``), or None and why."""

    form: str | None
    reason: str


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return tuple(int(s) for s in val.shape)


def _is_arange(node: Any, length: int) -> bool:
    """``node`` is ``arange(length)`` (start 0, step 1): made in the graph, or a folded constant."""
    if not isinstance(node, fx.Node):
        return False
    if node.target in _ARANGES:
        args = list(node.args)
        start, end, step = ((0, args[0], 1) if node.target is _aten.arange.default
                            else (*args[:2], args[2] if len(args) > 2 else 1))  # fmt: skip
        return (start, end, step) == (0, length, 1)
    if node.op == "get_attr" and node.graph.owning_module is not None:
        value = getattr(node.graph.owning_module, str(node.target), None)
        return (
            isinstance(value, torch.Tensor)
            and value.dim() == 1
            and value.numel() == length
            and bool((value.cpu() == torch.arange(length)).all())
        )
    return False


def _is_slot(node: Any, length: int) -> bool:
    """``node`` is one index ``[1]`` expanded to ``[length]`` (the row of a prefill)."""
    return (
        isinstance(node, fx.Node)
        and node.target is _aten.expand.default
        and _shape(node.args[0]) == (1,)
        and _shape(node) == (length,)
    )


def kv_cache_put_form(node: fx.Node) -> KVPut:
    """Which in-place KV-cache write this ``aten.index_put`` is, if any."""
    if node.target is not _aten.index_put.default or len(node.args) < 3:
        return KVPut(None, f"{node.format_node()} is not aten.index_put.default")
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if accumulate:
        return KVPut(None, "an accumulating index_put adds to the cache, it does not write it")
    if node.meta.get("_trt_no_kv_alias"):
        return KVPut(None, "Torch-TensorRT filed this write as copy-back (_trt_no_kv_alias)")
    cache, indices, values = node.args[:3]
    if not isinstance(cache, fx.Node) or cache.op != "placeholder":
        return KVPut(None, "the cache written is not a graph input (a view of one, say)")
    if len(cache.users) != 1 or any(u.op == "output" for u in cache.users):
        return KVPut(None, "the cache has other readers in the graph, which an in-place write "
                     "would change")  # fmt: skip
    cache_shape, value_shape = _shape(cache), _shape(values)
    if cache_shape is None or len(cache_shape) != 4 or value_shape is None:
        return KVPut(None, "the cache must be 4-D [B, H, L, D] with static shapes")
    idx = list(indices) if isinstance(indices, (list, tuple)) else []
    while len(idx) > 3 and idx[-1] is None:
        idx.pop()
    if len(idx) != 3 or idx[1] is not None or idx[0] is None or idx[2] is None:
        return KVPut(None, "the write is not cache[rows, :, positions] = values")
    dtype = cache.meta["val"].dtype
    if dtype != values.meta["val"].dtype or dtype not in _CACHE_DTYPES:  # type: ignore[union-attr]
        return KVPut(None, f"TensorRT's KV-cache layer takes float caches of the values' dtype "
                     f"(cache {dtype})")  # fmt: skip
    b, h, length, d = cache_shape
    rows, pos = idx[0], idx[2]
    if _is_arange(rows, b) and _shape(pos) == (b,) and value_shape == (b, h, d):
        return KVPut("rows", f"in-place KV-cache update of every row ({b}) at its own position")
    s = value_shape[0]
    if value_shape == (s, h, d) and s <= length and _is_slot(rows, s) and _is_arange(pos, s):
        return KVPut("slot", f"in-place KV-cache update of one row of {b}, positions [0, {s}) "
                     "(packed update)")  # fmt: skip
    return KVPut(None, f"values {list(value_shape)} at these indices are neither every row at "
                 "its own position nor one row from position 0")  # fmt: skip


def kv_cache_put_decision(node: fx.Node) -> Decision:
    put = kv_cache_put_form(node)
    return Decision(put.form is not None, put.reason)


def kv_cache_put_validator(node: fx.Node, compilation_settings: Any = None) -> bool:
    """Torch-TensorRT capability validator ``(node, settings) -> bool``."""
    return kv_cache_put_form(node).form is not None


def convert_kv_cache_put(ctx: Any, target: Any, args: Any, kwargs: Any, name: str) -> Any:
    """Emit ``IKVCacheUpdateLayer`` for a rows or slot write (TensorRT 11)."""
    import numpy as np
    import tensorrt as trt
    from torch_tensorrt.dynamo._SourceIR import SourceIR
    from torch_tensorrt.dynamo.conversion._ConversionContext import AliasedOutput, AliasKind
    from torch_tensorrt.dynamo.conversion.converter_utils import (
        cast_trt_tensor,
        get_trt_tensor,
        set_layer_name,
    )
    from torch_tensorrt.dynamo.conversion.impl.select import index_put_converter
    from torch_tensorrt.dynamo.conversion.impl.slice_scatter import (
        emit_kv_cache_update_layer,
        input_binding_name,
    )

    form = kv_cache_put_form(ctx.current_node).form
    cache_arg, indices, values_arg = args[:3]
    cache = get_trt_tensor(ctx, cache_arg, f"{name}_cache")
    values = get_trt_tensor(ctx, values_arg, f"{name}_values")
    b, h, _, d = (int(x) for x in cache.shape)
    out = None
    if form == "rows" and input_binding_name(ctx, cache) is not None:
        pos = get_trt_tensor(ctx, indices[2], f"{name}_pos")
        pos = cast_trt_tensor(ctx, pos, trt.int32, f"{name}_pos_int32")
        update = ctx.net.add_shuffle(values)  # [B, H, D] -> [B, H, 1, D]
        update.reshape_dims = (b, h, 1, d)
        out = emit_kv_cache_update_layer(ctx, name, cache, update.get_output(0), pos)
    elif form == "slot" and (binding := input_binding_name(ctx, cache)) is not None:
        s = int(values.shape[0])
        rows = get_trt_tensor(ctx, indices[0], f"{name}_rows")
        rows = cast_trt_tensor(ctx, rows, trt.int32, f"{name}_rows_int32")
        slot = ctx.net.add_slice(rows, start=(0,), shape=(1,), stride=(1,)).get_output(0)
        # cumulative tokens per row: 0 up to the slot, S after it
        ids = get_trt_tensor(ctx, np.arange(b + 1, dtype=np.int32), f"{name}_row_ids")
        after = ctx.net.add_elementwise(ids, slot, trt.ElementWiseOperation.GREATER)
        count = cast_trt_tensor(ctx, after.get_output(0), trt.int32, f"{name}_after_int32")
        tokens = get_trt_tensor(ctx, np.full((1,), s, dtype=np.int32), f"{name}_tokens")
        lengths = ctx.net.add_elementwise(count, tokens, trt.ElementWiseOperation.PROD)
        starts = get_trt_tensor(ctx, np.zeros((b,), dtype=np.int32), f"{name}_write_indices")
        layer = ctx.net.add_kv_cache_update(cache, values, starts, trt.KVCacheMode.LINEAR)
        if layer is not None:
            layer.update_form = trt.AttentionIOForm.PACKED_NHD
            layer.update_lengths = lengths.get_output(0)
            set_layer_name(layer, target, f"{name}_kv_cache_update", SourceIR.ATEN)
            out = layer.get_output(0)
            ctx.aliased_outputs.append(AliasedOutput(output_tensor=out, input_binding_name=binding,
                                                     kind=AliasKind.KV_CACHE_UPDATE))  # fmt: skip
    if out is None:  # not a network input after all: Torch-TensorRT's scatter (correct, a copy)
        return index_put_converter(ctx, target, SourceIR.ATEN, name, cache, indices, values)
    return out
