"""Quantized mixture-of-experts layers (Qwen3-MoE style: shared expert, per-head q/k norms):
every expert quantized like a dense linear, the router untouched, logits against the model
whose matrices are replaced by their dequantized copies."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torch_tensorrt_dist.models.llama import ModelArgs
from torch_tensorrt_dist.models.moe import SparseMoE
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.parallel.moe_load import random_moe
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model
from torch_tensorrt_dist.quantization.experts import QuantizedQKNormLinear, QuantizedSparseMoE
from torch_tensorrt_dist.quantization.tensors import (
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)

ARGS = ModelArgs(
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=96,
    intermediate_size=128,
    max_seq_len=32,
    qk_norm=True,
)
MOE = MoEArgs(
    n_experts=4,
    top_k=2,
    expert_size=64,
    shared_expert_size=32,
    sparse_layers=(1,),
    style="qwen3_moe",
)


def _dequantize(w: torch.Tensor, scheme: str) -> torch.Tensor:
    if scheme == "int8":
        return dequantize_int8(*quantize_int8(w))
    return dequantize_int4(*quantize_int4(w, 32), 32)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_moe_matches_its_dequantized_reference(scheme: str) -> None:
    model = random_moe(ARGS, MOE, seed=0)
    ref = random_moe(ARGS, MOE, seed=0)
    router = ref.blocks[1].feed_forward.gate.weight.detach().clone()  # type: ignore[union-attr]
    with torch.no_grad():
        for name, module in ref.named_modules():
            if (
                isinstance(module, nn.Linear)
                and name.startswith("layers.")
                and not name.endswith("gate")
            ):
                module.weight.copy_(_dequantize(module.weight, scheme))
            if isinstance(module, SparseMoE):
                for w in (module.w1, module.w3, module.w2):
                    w.copy_(torch.stack([_dequantize(e, scheme) for e in w]))
    report = quantize_model(model, QuantConfig(scheme, 32 if scheme == "int4" else None))
    assert report.layers == 2 * 4 + 3 + 3  # attention x 2 layers, dense MLP, shared expert
    moe = model.blocks[1].feed_forward
    assert isinstance(moe, QuantizedSparseMoE)
    assert isinstance(model.blocks[0].attention.wq, QuantizedQKNormLinear)
    assert torch.equal(moe.gate.weight, router)  # the router stays in the model dtype
    for m in (model, ref):
        m.setup_caches(1, 16)
    # fixed ids: the check holds where no token sits on a routing tie (the int8 kernel and the
    # dequantized reference differ by rounding, which can flip a top-k choice)
    tokens = torch.randint(0, ARGS.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(tokens, torch.arange(10))
        expected = ref(tokens, torch.arange(10))
    assert (got - expected).abs().max() <= 0.03 * expected.abs().max()
