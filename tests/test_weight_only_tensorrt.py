"""Weight-only quantized paged decode steps through real TensorRT engines (GPU + TensorRT only): the
converter's dequantize + matmul against Inductor (int8) and the PyTorch reference (int4), no
quantized matmul left to PyTorch, and the quantized weights still quantized in the built
engine (its ``IEngineInspector`` layer information: TensorRT may fold an INT8 dequantize of a
constant back into fp16/bf16 weights, which the numbers would not show)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.conversion.layers.weight_only import INT4_OP, INT8_OP
from torch_tensorrt_dist.generation.runner import compile_step, paged_step, setup_example
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model

from ._trt_checks import assert_no_fallback, detailed_layers, engine_layers, tensor_formats

pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu]

ARGS = ModelArgs(
    dim=256,
    n_layers=2,
    n_heads=8,
    n_kv_heads=4,
    vocab_size=512,
    intermediate_size=512,
    max_seq_len=64,
)


def _decode(scheme: str, engine: str, layers: list[Any] | None = None) -> torch.Tensor:
    """The decode logits; for engine='tensorrt', ``layers`` receives the engines' layers."""
    torch.manual_seed(0)
    model = Transformer(ARGS).to("cuda", torch.bfloat16).eval()
    config = QuantConfig(scheme, 64 if scheme == "int4" else None)
    # int4 on CUDA is stored for TensorRT (packed nibbles) whichever engine runs it here
    quantize_model(model, config, engine="tensorrt" if scheme == "int4" else engine)
    setup_example(model, 2, 32, block_size=16)
    # two rows decoding (R and NB dynamic, made on the GPU)
    rows = [([3], 9, [1, 2]), ([4], 17, [3, 4])]
    inputs = step_inputs(rows, StepLimits(4, 1, 4, 16), torch.device("cuda"))
    torch._dynamo.reset()
    with torch.no_grad(), recording() as graphs, detailed_layers():
        step = compile_step(paged_step(model), engine, verify=engine == "tensorrt")
        out = step(*inputs).float()
    torch._dynamo.reset()
    if engine == "tensorrt" and layers is not None:
        ops = {INT8_OP} if scheme == "int8" else {INT4_OP}
        for g in graphs:
            assert_no_fallback(g.engine_module, ops, f"{scheme} weight-only matmuls")
            layers += engine_layers(g.engine_module)
    return out


def test_int8_engine_matches_inductor() -> None:
    """Same codes and scales; the engine's INT8 dequantize + matmul against Inductor's
    ``aten._weight_int8pack_mm`` (verify also checks the engine's first call against the
    eager graph)."""
    layers: list[Any] = []
    trt = _decode("int8", "tensorrt", layers)
    inductor = _decode("int8", "inductor")
    assert (trt - inductor).abs().max() <= 0.02 * inductor.abs().max()
    # the int8 weights survive in the engine (not folded back into bf16 constants)
    formats = tensor_formats(layers)
    assert any("int8" in f for f in formats), sorted(formats)


def test_int4_engine_matches_the_pytorch_reference() -> None:
    """Inductor has no CUDA int4 layout of ours: the reference is the same graph run eagerly
    (the custom op dequantizes, then a dense matmul)."""
    layers: list[Any] = []
    trt = _decode("int4", "tensorrt", layers)
    eager = _decode("int4", "eager")
    assert (trt - eager).abs().max() <= 0.02 * eager.abs().max()
    formats = tensor_formats(layers)
    assert any("int4" in f for f in formats), sorted(formats)


def test_two_quantized_models_of_one_shape_each_run_their_own_codes() -> None:
    """The engine holds the codes and scales as constants, and Dynamo's guards let a second
    model of the same shapes into the first one's graph: the graph checks its frozen inputs
    on each call and builds itself again for the second model's, and again after codes are
    written in place (``freeze_constants.drop_frozen``; the CPU twin with the GEMM template:
    tests/test_frozen_weights.py)."""
    rows = [([3], 9, [1, 2]), ([4], 17, [3, 4])]
    limits, cuda = StepLimits(4, 1, 4, 16), torch.device("cuda")
    models, got = [], []
    torch._dynamo.reset()
    with torch.no_grad():
        for seed in (0, 1, 0):  # the third: the first model again, its codes rewritten
            if len(models) < 2:
                torch.manual_seed(seed)
                model = Transformer(ARGS).to("cuda", torch.bfloat16).eval()
                quantize_model(model, QuantConfig("int8"), engine="tensorrt")
                setup_example(model, 2, 32, block_size=16)
                models.append(model)
            else:
                model = models[0]
                codes = next(b for n, b in model.named_buffers() if b.dtype == torch.int8)
                codes.copy_(codes.flip(-1))  # a write in place: a new version
            inputs = step_inputs(rows, limits, cuda)
            want = paged_step(model)(*inputs).float()  # eager, the same codes
            out = compile_step(paged_step(model), "tensorrt", verify=False)(*inputs).float()
            assert (out - want).abs().max() <= 0.02 * want.abs().max(), seed
            got.append(out)
    torch._dynamo.reset()
    assert not torch.allclose(got[0], got[1]) and not torch.allclose(got[0], got[2])
