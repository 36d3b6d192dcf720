"""Weight-only quantized matmuls as TensorRT dequantize layers on constant weights.

Our quantized layers (``quantization/kernels.py``) reach Torch-TensorRT as one node each:

    aten._weight_int8pack_mm(x [M, K], codes int8 [N, K], scales [N])
    tensorrt_dist.int4_weight_only_mm(x [M, K], nibbles uint8 [N, K / 2], scales [N, K / g], g)

and become, with the codes and scales frozen into the graph as constants
(``lowering/freeze_constants.py``):

    constant W (INT8 [K, N], or INT4 [K, N] two per byte)  --\\
    constant S (float32: [N] per output channel,             IDequantizeLayer (axis 1, or
                or [K / g, N] per block of g rows)         --/   axis 0 for blocks) -> W'
    x [M, K] @ W' (IMatrixMultiplyLayer)  -> [M, N]

The weight is laid out ``[K, N]`` (transposed at build time) so the dequantize feeds the
matmul's second input directly.

What TensorRT documents, and what it does not:

* **INT4**: weight-only quantization is a TensorRT feature (the 10.0 release notes; the
  headers' block dequantization for kINT4, a scale of the input's rank). TensorRT's
  documentation gives INT4 weight-only block sizes of 64 and 128 (the headers state no limit),
  so a model quantized with group size 32 (valid for the inductor and eager engines) keeps
  those matmuls in PyTorch here, saying so (:func:`weight_only_decision`; the CLI refuses
  ``--engine tensorrt --group-size 32``). The
  INT4 dequantize outputs float32 and a cast follows: upstream Torch-TensorRT's example
  ``examples/dynamo/torchao/int4_utils.py`` (Torch-TensorRT 2.14 itself has no INT4
  converter) builds its blocked INT4 dequantize that way, noting that a float32 output is what
  TensorRT's Myelin backend accepts for it.
* **INT8**: TensorRT's documentation lists INT8 for weight-and-activation (W8A8) quantization,
  not as a weight-only kernel. What we emit is an INT8 dequantize of a constant weight (output
  in the activations' dtype, a float32 per-channel scale) feeding the matmul; TensorRT may fuse
  it into an INT8 weight-only GEMM or fold the dequantize into the constant and keep fp16/bf16
  weights, which would lose the memory saving. Which one happens has not been checked here (no
  GPU): ``tests/test_weight_only_tensorrt.py`` reads the built engine's layer information
  (``IEngineInspector``) and must find the int8 weights there.

:func:`weight_only_decision` and :func:`weight_only_spec` are pure (FX metadata, shapes,
dtypes; tested on CPU); :func:`trt_weight` and :func:`trt_scales` lay out the constants (pure
torch); :func:`convert_weight_only` is the TensorRT shell, run where TensorRT is installed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx

from torch_tensorrt_dist.conversion.interface import Decision
from torch_tensorrt_dist.quantization.kernels import int4_weight_only_mm
from torch_tensorrt_dist.quantization.tensors import pack_int4, unpack_int4

__all__ = [
    "INT4_OP",
    "INT8_OP",
    "MIN_TENSORRT",
    "TENSORRT_INT4_BLOCKS",
    "WeightOnlySpec",
    "constant_name",
    "convert_weight_only",
    "trt_scales",
    "trt_weight",
    "weight_only_decision",
    "weight_only_spec",
    "weight_only_validator",
]

logger = logging.getLogger(__name__)

INT8_OP = torch.ops.aten._weight_int8pack_mm.default
INT4_OP = int4_weight_only_mm._opoverload  # torch.ops.tensorrt_dist.int4_weight_only_mm.default

#: the oldest TensorRT whose network takes each dequantize as built here: the three-argument
#: addDequantize (an output type) from 9.0, INT4 block dequantization from 10.0
MIN_TENSORRT = {"int8": (9, 0), "int4": (10, 0)}
#: INT4 block sizes TensorRT's block dequantization takes (our inductor/eager engines also take 32)
TENSORRT_INT4_BLOCKS = (64, 128)
#: activation dtypes and their ``trt.DataType`` member names
_ACTIVATIONS = {torch.float32: "FLOAT", torch.float16: "HALF", torch.bfloat16: "BF16"}
_warned: set[str] = set()


@dataclass(frozen=True)
class WeightOnlySpec:
    """Everything the TensorRT shell builds, decided without TensorRT."""

    scheme: str
    """``int8`` or ``int4``."""
    in_features: int
    out_features: int
    block_size: int | None
    """int4: rows of the ``[K, N]`` weight per scale."""
    weight_type: str
    """``trt.DataType`` member of the weight constant: ``INT8`` or ``INT4``."""
    weight_shape: tuple[int, int]
    """``(K, N)``: the constant, transposed so that ``x @ W`` needs no transpose."""
    scale_shape: tuple[int, ...]
    """``(N,)`` per output channel, ``(K / g, N)`` per block."""
    axis: int
    """The dequantize axis: 1 (the output channels of ``[K, N]``) or 0 (the blocked rows)."""
    dequantize_to: str
    """``trt.DataType`` member of the dequantize output."""
    cast_to: str | None
    """Cast the dequantized weight to this ``trt.DataType`` member (None: already there)."""


def weight_only_spec(
    scheme: str,
    x_dtype: torch.dtype,
    weight_shape: tuple[int, ...],
    scale_shape: tuple[int, ...],
    group_size: int | None = None,
) -> WeightOnlySpec:
    """The layers for one weight-only matmul from its operands' shapes and dtypes (as stored:
    int8 ``[N, K]`` / ``[N]``, int4 ``[N, K / 2]`` / ``[N, K / g]``); ValueError when they do
    not fit together."""
    act = _ACTIVATIONS.get(x_dtype)
    if act is None:
        raise ValueError(f"activations of {x_dtype}; TensorRT dequantizes to float32/16, bf16")
    if scheme == "int8":
        n, k = weight_shape
        if tuple(scale_shape) != (n,):
            raise ValueError(f"int8 scales {list(scale_shape)} for {n} output channels")
        return WeightOnlySpec("int8", k, n, None, "INT8", (k, n), (n,), 1, act, None)
    if scheme != "int4":
        raise ValueError(f"unknown scheme {scheme!r}")
    n, k = weight_shape[0], 2 * weight_shape[1]
    g = group_size or 0
    if g <= 0 or k % g or tuple(scale_shape) != (n, k // g):
        raise ValueError(
            f"int4 scales {list(scale_shape)} do not make groups of {g} in a [{n}, {k}] weight"
        )
    if n % 2:
        raise ValueError(f"{n} output channels: an INT4 [K, N] constant packs N in pairs")
    cast = None if act == "FLOAT" else act
    return WeightOnlySpec("int4", k, n, g, "INT4", (k, n), (k // g, n), 0, "FLOAT", cast)


def _val(node: Any) -> Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, Tensor) else None


def weight_only_decision(
    node: fx.Node,
    *,
    tensorrt_version: tuple[int, ...] | None = None,
    immutable_weights: bool = True,
    require_constants: bool = True,
) -> Decision:
    """Can this weight-only matmul become a dequantize + matmul in TensorRT?
    ``require_constants=False`` asks what happens under ``engine='tensorrt'``, which freezes
    the codes and scales first (``explain`` traces with the eager engine, which does not)."""
    if node.target is INT8_OP:
        scheme, group = "int8", None
    elif node.target is INT4_OP:
        g = node.args[3] if len(node.args) > 3 else node.kwargs.get("group_size")
        scheme, group = "int4", g if isinstance(g, int) else None
    else:
        return Decision(False, f"{node.format_node()} is not a weight-only matmul")
    x, weight, scales = node.args[:3]
    for what, arg in (("codes", weight), ("scales", scales)):
        if not isinstance(arg, fx.Node) or (require_constants and arg.op != "get_attr"):
            return Decision(
                False,
                f"the {what} are not a constant of the graph (TensorRT dequantizes constant "
                "weights only; the backend freezes them for engine='tensorrt')",
            )
    xv, wv, sv = _val(x), _val(weight), _val(scales)
    if xv is None or wv is None or sv is None or xv.dim() != 2:
        return Decision(False, "the operands lack static 2-D shapes")
    if (scheme, wv.dtype) not in (("int8", torch.int8), ("int4", torch.uint8)):
        return Decision(False, f"{scheme} codes stored as {wv.dtype}")
    try:
        spec = weight_only_spec(scheme, xv.dtype, tuple(wv.shape), tuple(sv.shape), group)
    except ValueError as exc:
        return Decision(False, str(exc))
    if xv.shape[1] != spec.in_features:
        return Decision(False, f"x has {xv.shape[1]} columns, the weight {spec.in_features}")
    need = MIN_TENSORRT[scheme]
    if tensorrt_version is not None and tuple(tensorrt_version[:2]) < need:
        return Decision(
            False,
            f"TensorRT {'.'.join(map(str, tensorrt_version))} cannot dequantize {spec.weight_type}"
            f" weights this way; it needs {need[0]}.{need[1]} or newer",
        )
    if spec.block_size is not None and spec.block_size not in TENSORRT_INT4_BLOCKS:
        return Decision(
            False,
            f"int4 group size {spec.block_size}: TensorRT's INT4 block dequantization takes "
            "blocks of 64 or 128 weights; quantize with --group-size 64 or 128 for "
            "engine='tensorrt'",
        )
    if scheme == "int4" and not immutable_weights:
        return Decision(
            False,
            "refittable engine: a refit would push uint8 codes into an INT4 constant; compile "
            "with immutable_weights=True",
        )
    blocks = f"blocks of {spec.block_size}" if spec.block_size else "per output channel"
    return Decision(
        True,
        f"{spec.weight_type} [{spec.in_features}, {spec.out_features}] dequantized ({blocks}) "
        f"into a {spec.dequantize_to} matmul",
    )


def _installed_tensorrt() -> tuple[int, ...] | None:
    try:
        import tensorrt as trt
    except ImportError:
        return None
    return tuple(int(p) for p in str(trt.__version__).split(".")[:2] if p.isdigit())


def weight_only_validator(node: fx.Node, compilation_settings: Any = None) -> bool:
    """Torch-TensorRT capability validator ``(node, settings) -> bool``; a refusal is logged
    once (the node then runs in PyTorch: correct, not fast)."""
    decision = weight_only_decision(
        node,
        tensorrt_version=_installed_tensorrt(),
        immutable_weights=bool(getattr(compilation_settings, "immutable_weights", True)),
    )
    if not decision.convertible and f"{node.name}: {decision.reason}" not in _warned:
        _warned.add(f"{node.name}: {decision.reason}")
        logger.warning("%s stays in PyTorch: %s", node.name, decision.reason)
    return decision.convertible


def trt_weight(spec: WeightOnlySpec, codes: Tensor) -> Tensor:
    """The stored codes as the ``[K, N]`` constant's bytes (INT4: two per byte, element
    ``2j`` of a row in the low nibble, as ``tensors.pack_int4`` packs)."""
    if spec.scheme == "int8":
        return codes.t().contiguous()  # [K, N] int8
    return pack_int4(unpack_int4(codes).t().contiguous())  # [K, N / 2] uint8


def trt_scales(spec: WeightOnlySpec, scales: Tensor) -> Tensor:
    """float32 scales of the shape the dequantize wants (``spec.scale_shape``)."""
    s = scales.float()
    return (s if spec.scheme == "int8" else s.t()).contiguous()


def constant_name(name: str) -> str:
    """The codes constant's layer name; its weights are recorded for refit as
    ``f"{constant_name(name)} CONSTANT"`` (Torch-TensorRT's ``to_trt_weights``)."""
    return f"{name}_codes"


def convert_weight_only(ctx: Any, target: Any, args: Any, kwargs: Any, name: str) -> Any:
    """Constant weight + scale -> IDequantizeLayer (-> cast) -> IMatrixMultiplyLayer."""
    import tensorrt as trt
    from torch_tensorrt.dynamo._SourceIR import SourceIR
    from torch_tensorrt.dynamo.conversion.converter_utils import (
        cast_trt_tensor,
        get_trt_tensor,
        set_layer_name,
        to_trt_weights,
    )

    from torch_tensorrt_dist.conversion.dtypes import TRT_DATA_TYPE

    x = get_trt_tensor(ctx, args[0], f"{name}_x")
    codes, scales = args[1], args[2]
    x_dtype = next(d for d, v in TRT_DATA_TYPE.items() if v == int(x.dtype))
    scheme = "int8" if target is INT8_OP else "int4"
    group = args[3] if scheme == "int4" else None
    spec = weight_only_spec(scheme, x_dtype, tuple(codes.shape), tuple(scales.shape), group)
    weight = trt_weight(spec, codes.detach().cpu())
    k, n = spec.weight_shape
    constant = ctx.net.add_constant(
        trt.Dims(spec.weight_shape),
        to_trt_weights(
            ctx,
            weight,
            constant_name(name),
            "CONSTANT",
            "CONSTANT",
            dtype=getattr(trt.DataType, spec.weight_type),
            count=k * n,
        ),
    )
    # named as Torch-TensorRT's create_constant names its constants: the refit map records
    # this weight under f"{layer name} CONSTANT" (to_trt_weights), so the layer keeps the name
    # given to to_trt_weights (set_layer_name would rename it, and a refit would not find it)
    constant.name = constant_name(name)
    scale = get_trt_tensor(ctx, trt_scales(spec, scales.detach().cpu()), f"{name}_scales")
    dq = ctx.net.add_dequantize(
        constant.get_output(0), scale, getattr(trt.DataType, spec.dequantize_to)
    )
    dq.axis = spec.axis
    set_layer_name(dq, target, f"{name}_dequantize", SourceIR.ATEN)
    w = dq.get_output(0)
    if spec.cast_to is not None:
        w = cast_trt_tensor(ctx, w, getattr(trt.DataType, spec.cast_to), f"{name}_cast")
    mm = ctx.net.add_matrix_multiply(x, trt.MatrixOperation.NONE, w, trt.MatrixOperation.NONE)
    set_layer_name(mm, target, f"{name}_matmul", SourceIR.ATEN)
    return mm.get_output(0)
