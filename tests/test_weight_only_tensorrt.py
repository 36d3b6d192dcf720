"""Weight-only quantized decode steps through real TensorRT engines (GPU + TensorRT only): the
converter's dequantize + matmul against Inductor (int8) and the PyTorch reference (int4)."""

from __future__ import annotations

import pytest
import torch

from torch_tensorrt_dist.generation.generate import compile_step, decode_example, decode_step
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model

pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu]

ARGS = ModelArgs(
    dim=256, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=512, intermediate_size=512,
    max_seq_len=64,
)  # fmt: skip


def _decode(scheme: str, engine: str) -> torch.Tensor:
    torch.manual_seed(0)
    model = Transformer(ARGS).to("cuda", torch.bfloat16).eval()
    config = QuantConfig(scheme, 64 if scheme == "int4" else None)
    # int4 on CUDA is stored for TensorRT (packed nibbles) whichever engine runs it here
    quantize_model(model, config, engine="tensorrt" if scheme == "int4" else engine)
    model.setup_caches(1, 32)
    inputs = [t.cuda() for t in decode_example(1, slot=3)]
    torch._dynamo.reset()
    with torch.no_grad():
        step = compile_step(decode_step(model), engine, verify=engine == "tensorrt")
        out = step(*inputs).float()
    torch._dynamo.reset()
    return out


def test_int8_engine_matches_inductor() -> None:
    """Same codes and scales; the engine's INT8 dequantize + matmul against Inductor's
    ``aten._weight_int8pack_mm`` (verify also checks the engine's first call against the
    eager graph)."""
    trt = _decode("int8", "tensorrt")
    inductor = _decode("int8", "inductor")
    assert (trt - inductor).abs().max() <= 0.02 * inductor.abs().max()


def test_int4_engine_matches_the_pytorch_reference() -> None:
    """Inductor has no CUDA int4 layout of ours: the reference is the same graph run eagerly
    (the custom op dequantizes, then a dense matmul)."""
    trt = _decode("int4", "tensorrt")
    eager = _decode("int4", "eager")
    assert (trt - eager).abs().max() <= 0.02 * eager.abs().max()
