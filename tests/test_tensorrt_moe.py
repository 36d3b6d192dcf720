"""A MoE paged prefill on a real TensorRT engine (skipped where TensorRT or a GPU is absent): the
grouped experts op becomes IMoELayer on SM 10.x/11.x, elsewhere it runs in PyTorch between
engines; either way the logits equal the PyTorch model's. Beyond the numbers (which a fallback
also gets right), the built module is read: how many experts ops run in PyTorch, and whether
the engines hold MoE layers."""

from __future__ import annotations

import pytest
import torch

from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.conversion.layers.moe_experts import moe_layer_environment
from torch_tensorrt_dist.generation.runner import compile_step, paged_step, setup_example
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.ops.experts import EXPERTS_OP
from torch_tensorrt_dist.parallel.moe_load import random_moe

from ._trt_checks import detailed_layers, torch_ops_left

ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=64)
MOE = MoEArgs(n_experts=8, top_k=2, expert_size=64, sparse_layers=(0, 1))


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_prefill_with_grouped_experts_on_tensorrt_equals_pytorch() -> None:
    engine_model = random_moe(ARGS, MOE, seed=0, dtype=torch.bfloat16).cuda()
    reference = random_moe(ARGS, MOE, seed=0, dtype=torch.bfloat16).cuda()
    for model in (engine_model, reference):
        setup_example(model, 1, 32)
        for block in model.sparse_blocks:  # the grouped experts op, whatever the token count
            block.compute = "grouped"
    # one 16-token prompt chunk into blocks 1..2 (S and NB dynamic, made on the GPU)
    prompt = [i % ARGS.vocab_size for i in range(1, 17)]
    inputs = step_inputs([(prompt, 0, [1, 2])], StepLimits(1, 32, 4, 16), torch.device("cuda"))
    with torch.no_grad(), recording() as graphs, detailed_layers():
        got = compile_step(paged_step(engine_model), "tensorrt")(*inputs)
        want = paged_step(reference)(*inputs)
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
    env = moe_layer_environment()
    split = [op.module for g in graphs for op in g.torch_ops if op.op == "moe_experts"]
    modules = [g.engine_module for g in graphs]
    assert modules and all(m is not None for m in modules)
    in_torch = sum(torch_ops_left(m, {EXPERTS_OP}) for m in modules)
    if env.compute_capability and env.compute_capability[0] in (10, 11) and env.moe_layer:
        # one IMoELayer per MoE layer, inside the engine: no experts op runs in PyTorch (layer
        # names are no proof: TensorRT may fuse the layer into a node that keeps none of ours)
        assert split == [] and in_torch == 0
    else:
        assert split == ["layers.0.feed_forward", "layers.1.feed_forward"]
        assert in_torch == 2  # the engine splits around both ops
