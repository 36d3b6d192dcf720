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
  row ``slot`` and none to the others, with ``writeIndices`` all 0 (:func:`slot_update_lengths`).
  ``add_kv_cache_update`` creates the layer in the default padded form, whose update is
  ``[B, H, S, D]``, so the layer is created with a padded placeholder update ``[B, H, 1, D]``,
  then switched to the packed form, then given the real update (``set_input(1, v)``) and the
  lengths: every step leaves a layer the API accepts. The packed form is used where the
  installed TensorRT has it (``hasattr(trt, "AttentionIOForm")`` and the layer's
  ``update_form``), else the write is Torch-TensorRT's scatter (correct, a copy).
* The slot must be a row of the cache, ``0 <= slot < B``: with ``slot >= B`` the lengths end
  in 0, not the ``S`` tokens of the update, which the header leaves undefined. A slot that is a
  constant of the graph is checked here (the write is refused, or the converter raises); a slot
  given at run time is checked by its caller (``generation/slots.py``: ``Slots.join`` refuses a
  slot outside ``[0, rows)``), as the engine cannot raise.

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
    "check_slot",
    "convert_kv_cache_put",
    "kv_cache_put_decision",
    "kv_cache_put_form",
    "kv_cache_put_validator",
    "packed_update_available",
    "slot_update_lengths",
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
        start, end, step = (
            (0, args[0], 1)
            if node.target is _aten.arange.default
            else (*args[:2], args[2] if len(args) > 2 else 1)
        )
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


def _constant_slot(node: fx.Node) -> int | None:
    """The slot of a prefill write when the graph holds it as a constant (None: an input)."""
    src = node.args[0]
    if isinstance(src, fx.Node) and src.op == "get_attr" and src.graph.owning_module is not None:
        value = getattr(src.graph.owning_module, str(src.target), None)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return int(value.reshape(-1)[0])
    return None


def check_slot(slot: int, rows: int) -> None:
    """A prefill writes one row of the cache: ValueError for a slot outside ``[0, rows)``."""
    if not 0 <= slot < rows:
        raise ValueError(
            f"KV-cache slot {slot} is not a row of a cache of {rows} rows; the packed update's "
            f"lengths would end in 0, not its token count: use a slot in [0, {rows})"
        )


def slot_update_lengths(rows: int, slot: int, tokens: int) -> list[int]:
    """The packed update's cumulative lengths ``[rows + 1]`` for ``tokens`` tokens into row
    ``slot``: 0 up to and including the slot, ``tokens`` after it (row ``i`` gets
    ``lengths[i + 1] - lengths[i]``); the converter computes the same in the graph as
    ``(arange(rows + 1) > slot) * tokens``."""
    check_slot(slot, rows)
    return [tokens if i > slot else 0 for i in range(rows + 1)]


def packed_update_available(trt: Any) -> bool:
    """The installed TensorRT's Python API has the packed KV-cache update form."""
    layer = getattr(trt, "IKVCacheUpdateLayer", None)
    return (
        hasattr(trt, "AttentionIOForm")
        and hasattr(trt.AttentionIOForm, "PACKED_NHD")
        and layer is not None
        and hasattr(layer, "update_form")
        and hasattr(layer, "update_lengths")
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
        return KVPut(
            None, "the cache has other readers in the graph, which an in-place write would change"
        )
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
        return KVPut(
            None,
            f"TensorRT's KV-cache layer takes float caches of the values' dtype (cache {dtype})",
        )
    b, h, length, d = cache_shape
    rows, pos = idx[0], idx[2]
    if _is_arange(rows, b) and _shape(pos) == (b,) and value_shape == (b, h, d):
        return KVPut("rows", f"in-place KV-cache update of every row ({b}) at its own position")
    s = value_shape[0]
    if value_shape == (s, h, d) and s <= length and _is_slot(rows, s) and _is_arange(pos, s):
        slot = _constant_slot(rows)
        if slot is not None and not 0 <= slot < b:
            return KVPut(None, f"the slot {slot} is not a row of the cache's {b}")
        return KVPut(
            "slot",
            f"in-place KV-cache update of one row of {b}, positions [0, {s}) (packed update)",
        )
    return KVPut(
        None,
        f"values {list(value_shape)} at these indices are neither every row at "
        "its own position nor one row from position 0",
    )


def kv_cache_put_decision(node: fx.Node, *, packed_update: bool = True) -> Decision:
    """:func:`kv_cache_put_form` as a decision; ``packed_update``: whether the installed
    TensorRT has the packed form a slot write needs."""
    put = kv_cache_put_form(node)
    if put.form == "slot" and not packed_update:
        return Decision(False, "this TensorRT has no packed KV-cache update (AttentionIOForm)")
    return Decision(put.form is not None, put.reason)


def kv_cache_put_validator(node: fx.Node, compilation_settings: Any = None) -> bool:
    """Torch-TensorRT capability validator ``(node, settings) -> bool`` (runs where
    Torch-TensorRT, hence TensorRT, is imported)."""
    import tensorrt as trt

    return kv_cache_put_decision(node, packed_update=packed_update_available(trt)).convertible


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
        if not isinstance(indices[0], trt.ITensor):  # the slot folded into a constant
            check_slot(int(torch.as_tensor(indices[0]).reshape(-1)[0]), b)
        rows = get_trt_tensor(ctx, indices[0], f"{name}_rows")
        rows = cast_trt_tensor(ctx, rows, trt.int32, f"{name}_rows_int32")
        slot = ctx.net.add_slice(rows, start=(0,), shape=(1,), stride=(1,)).get_output(0)
        # cumulative tokens per row (slot_update_lengths): 0 up to the slot, S after it
        ids = get_trt_tensor(ctx, np.arange(b + 1, dtype=np.int32), f"{name}_row_ids")
        after = ctx.net.add_elementwise(ids, slot, trt.ElementWiseOperation.GREATER)
        count = cast_trt_tensor(ctx, after.get_output(0), trt.int32, f"{name}_after_int32")
        tokens = get_trt_tensor(ctx, np.full((1,), s, dtype=np.int32), f"{name}_tokens")
        lengths = ctx.net.add_elementwise(count, tokens, trt.ElementWiseOperation.PROD)
        starts = get_trt_tensor(ctx, np.zeros((b,), dtype=np.int32), f"{name}_write_indices")
        # created in the default padded form with a padded update [B, H, 1, D], then packed:
        # the packed update [S, H, D] and its lengths only once the form allows them
        dtype = ctx.current_node.args[0].meta["val"].dtype
        padded = get_trt_tensor(ctx, torch.zeros(b, h, 1, d, dtype=dtype), f"{name}_padded")
        layer = ctx.net.add_kv_cache_update(cache, padded, starts, trt.KVCacheMode.LINEAR)
        if layer is not None:
            layer.update_form = trt.AttentionIOForm.PACKED_NHD
            layer.set_input(1, values)
            layer.update_lengths = lengths.get_output(0)
            set_layer_name(layer, target, f"{name}_kv_cache_update", SourceIR.ATEN)
            out = layer.get_output(0)
            ctx.aliased_outputs.append(
                AliasedOutput(
                    output_tensor=out, input_binding_name=binding, kind=AliasKind.KV_CACHE_UPDATE
                )
            )
    if out is None:  # not a network input after all: Torch-TensorRT's scatter (correct, a copy)
        return index_put_converter(ctx, target, SourceIR.ATEN, name, cache, indices, values)
    return out
