"""The TensorRT side of weight-only quantization, without TensorRT: freezing the codes into the
graph as constants, the converter's decision on captured graphs, and the layout of the
constants it builds (checked against the dequantized reference)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from torch_tensorrt_dist.conversion.layers.weight_only import (
    INT4_OP,
    INT8_OP,
    trt_scales,
    trt_weight,
    weight_only_decision,
    weight_only_spec,
)
from torch_tensorrt_dist.generation.runner import decode_example, paged_step, setup_example
from torch_tensorrt_dist.lowering.freeze_constants import drop_frozen, freeze_inputs
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model
from torch_tensorrt_dist.quantization.tensors import (
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

ARGS = ModelArgs(
    dim=64,
    n_layers=1,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=64,
    intermediate_size=128,
    max_seq_len=32,
)


def test_int8_spec_and_constants() -> None:
    spec = weight_only_spec("int8", torch.bfloat16, (96, 64), (96,))
    assert (spec.weight_type, spec.weight_shape, spec.scale_shape, spec.axis) == (
        "INT8",
        (64, 96),
        (96,),
        1,
    )
    assert (spec.dequantize_to, spec.cast_to) == ("BF16", None)
    w = torch.randn(96, 64)
    q, s = quantize_int8(w)
    constant, scale = trt_weight(spec, q), trt_scales(spec, s)
    assert constant.shape == (64, 96) and scale.dtype == torch.float32
    # what IDequantizeLayer computes with axis 1 on [K, N]: row k, column n times scale[n]
    assert torch.equal(constant.float() * scale[None, :], dequantize_int8(q, s).t())


@pytest.mark.parametrize(("x_dtype", "cast"), [(torch.float32, None), (torch.bfloat16, "BF16")])
def test_int4_spec_and_constants(x_dtype: torch.dtype, cast: str | None) -> None:
    w = torch.randn(48, 128)
    q, s = quantize_int4(w, 64)
    stored = pack_int4(q)  # [48, 64]
    spec = weight_only_spec("int4", x_dtype, tuple(stored.shape), tuple(s.shape), 64)
    assert (spec.in_features, spec.out_features, spec.block_size) == (128, 48, 64)
    assert (spec.weight_shape, spec.scale_shape, spec.axis) == ((128, 48), (2, 48), 0)
    assert (spec.dequantize_to, spec.cast_to) == ("FLOAT", cast)
    constant, scale = trt_weight(spec, stored), trt_scales(spec, s)
    assert constant.shape == (128, 24) and constant.dtype == torch.uint8
    # blocks of 64 rows along axis 0 of [K, N]: element (k, n) times scale[k // 64, n]
    blocked = unpack_int4(constant).float() * scale.repeat_interleave(64, dim=0)
    assert torch.equal(blocked, dequantize_int4(q, s, 64).t())


def test_spec_refuses_what_tensorrt_cannot_take() -> None:
    with pytest.raises(ValueError, match="pairs"):
        weight_only_spec("int4", torch.float32, (47, 64), (47, 4), 32)
    with pytest.raises(ValueError, match="do not make groups of 48"):
        weight_only_spec("int4", torch.float32, (48, 64), (48, 4), 48)
    with pytest.raises(ValueError, match="int8 scales"):
        weight_only_spec("int8", torch.float32, (48, 64), (64,))
    with pytest.raises(ValueError, match=r"activations of torch\.int32"):
        weight_only_spec("int8", torch.int32, (48, 64), (48,))


def _example() -> tuple[torch.Tensor, ...]:
    """A one-row paged decode step (a cache of :func:`_setup`)."""
    return decode_example(1, 16, block_size=4)


def _setup(model: Transformer) -> None:
    """A fresh paged cache for one row of 16 tokens."""
    setup_example(model, 1, 16, block_size=4)


def _capture(model: torch.nn.Module, *, freeze: bool) -> tuple[Any, Any]:
    """The aten decode graph the TensorRT engine gets (weights frozen as our backend does),
    and its compiled result on the example inputs."""
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        def fw(aten_gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
            keep = freeze_inputs(aten_gm, inputs, example_inputs) if freeze else None
            graphs.append(aten_gm)
            run = aten_gm.forward

            def boxed(args: list[Any]) -> Any:
                out = run(*args)
                args.clear()
                return out

            boxed._boxed_call = True  # type: ignore[attr-defined]
            return boxed if keep is None else drop_frozen(boxed, keep)

        return aot_autograd(fw_compiler=fw, inference_compiler=fw)(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(paged_step(model), backend=backend, fullgraph=True)(*_example())
    torch._dynamo.reset()
    return graphs[-1], out


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_frozen_decode_graph_converts_every_quantized_matmul(scheme: str) -> None:
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    quantize_model(model, QuantConfig(scheme, 64 if scheme == "int4" else None), engine="tensorrt")
    _setup(model)
    with torch.no_grad():
        expected = paged_step(model)(*_example())
    _setup(model)
    gm, out = _capture(model, freeze=True)
    assert torch.equal(out, expected)  # the frozen graph computes the same
    op = INT8_OP if scheme == "int8" else INT4_OP
    nodes = list(gm.graph.find_nodes(op="call_function", target=op))
    assert len(nodes) == 7
    placeholders = gm.graph.find_nodes(op="placeholder")
    codes = (torch.int8, torch.uint8)
    assert not [p for p in placeholders if getattr(p.meta["val"], "dtype", None) in codes]
    decisions = [weight_only_decision(n, tensorrt_version=(11, 1)) for n in nodes]
    assert all(d.convertible for d in decisions), decisions
    weight = (
        "INT8 [64, 64] dequantized (per output channel)"
        if scheme == "int8"
        else ("INT4 [64, 64] dequantized (blocks of 64)")
    )
    assert decisions[0].reason.startswith(weight)  # wq: [K, N] = [64, 64]


def test_unfrozen_or_old_or_refittable_is_left_to_pytorch_with_the_reason() -> None:
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    quantize_model(model, QuantConfig("int4", 64), engine="tensorrt")
    _setup(model)
    gm, _ = _capture(model, freeze=False)
    node = next(iter(gm.graph.find_nodes(op="call_function", target=INT4_OP)))
    assert "codes are not a constant of the graph" in weight_only_decision(node).reason
    _setup(model)
    gm, _ = _capture(model, freeze=True)
    node = next(iter(gm.graph.find_nodes(op="call_function", target=INT4_OP)))
    old = weight_only_decision(node, tensorrt_version=(9, 3))
    assert not old.convertible and "needs 10.0 or newer" in old.reason
    refit = weight_only_decision(node, tensorrt_version=(11, 1), immutable_weights=False)
    assert not refit.convertible and "immutable_weights=True" in refit.reason


def test_int4_group_32_is_left_to_pytorch_for_tensorrt() -> None:
    """Group 32 is valid for the inductor/eager engines, but TensorRT's INT4 block
    dequantization takes blocks of 64 or 128: the matmul stays in PyTorch, and explain's list
    of ops left to PyTorch (``torch_ops_in``) carries the reason."""
    from torch_tensorrt_dist.backend.report import torch_ops_in

    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    quantize_model(model, QuantConfig("int4", 32), engine="tensorrt")
    _setup(model)
    gm, _ = _capture(model, freeze=True)
    nodes = list(gm.graph.find_nodes(op="call_function", target=INT4_OP))
    decision = weight_only_decision(nodes[0], tensorrt_version=(11, 1))
    assert not decision.convertible
    assert decision.reason.startswith("int4 group size 32: TensorRT's INT4 block dequantization")
    assert "--group-size 64 or 128" in decision.reason
    ops = torch_ops_in(gm)
    quantized = [op for op in ops if op.op == "int4_weight_only_mm"]
    assert len(quantized) == 7 and {op.reason for op in quantized} == {decision.reason}
    # explain traces with the eager engine (weights not frozen): asked as if frozen
    _setup(model)
    gm, _ = _capture(model, freeze=False)
    assert {op.reason for op in torch_ops_in(gm, require_constants=False)} == {decision.reason}
