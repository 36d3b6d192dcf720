"""Aten graphs of the paged step (``Transformer.paged_step``) as Torch-TensorRT gets them.

    graph = capture(paged_model(), decode_inputs())
    graph.gm, graph.outputs        # the graph, and the outputs that are new values of inputs

Dynamo with R, S and NB marked dynamic (``step_inputs``), then AOTAutograd's default, which
``engine="tensorrt"`` traces with: the pools' writes are functional and returned as the pools'
new values (``mutations=True`` keeps them in the graph as ``copy_``, the eager/Inductor form).
The mutation outputs are read inside the compile (``paged_kv.mutation_outputs``), where the
tracing context knows them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._dynamo.backends.common import aot_autograd

from torch_tensorrt_dist.conversion.layers.paged_kv import mutation_outputs
from torch_tensorrt_dist.generation.runner import paged_step
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.lowering import fuse_collectives
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.parallel.moe_load import random_moe

#: grouped-query attention (2 query heads per KV head), 2 layers
ARGS = ModelArgs(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64, intermediate_size=64
)
MOE = MoEArgs(n_experts=8, top_k=2, expert_size=32, sparse_layers=(0, 1))
LIMITS = StepLimits(rows=4, tokens=32, blocks=16, block_size=4)
BLOCKS, BLOCK_SIZE = 16, 4
POOL = (BLOCKS, BLOCK_SIZE, ARGS.n_kv_heads, ARGS.head_dim)


@dataclass
class Captured:
    gm: fx.GraphModule
    outputs: frozenset[fx.Node] = field(default_factory=frozenset)


def paged_model(moe: bool = False, seed: int = 0) -> Transformer:
    """The dense model, or the MoE one with its experts as the grouped op (``compute``)."""
    torch.manual_seed(seed)
    if moe:
        model: Transformer = random_moe(ARGS, MOE, seed=seed)
        for block in model.sparse_blocks:  # type: ignore[attr-defined]
            block.compute = "grouped"
    else:
        model = Transformer(ARGS)
    model.eval()
    model.setup_paged(BLOCKS, BLOCK_SIZE, ARGS.max_seq_len)
    return model


def decode_inputs() -> tuple[torch.Tensor, ...]:
    """Two rows decoding one token each (R and NB dynamic, S = 1)."""
    return step_inputs([([3], 5, [1, 2]), ([4], 9, [3, 4, 5])], LIMITS, torch.device("cpu"))


def prefill_inputs() -> tuple[torch.Tensor, ...]:
    """Two prompt chunks, right-padded (R, S and NB dynamic): 7 tokens from position 0, 3 from
    position 4 (the row's first block already written)."""
    rows = [([1, 2, 3, 4, 5, 6, 7], 0, [6, 7]), ([8, 9, 10], 4, [8, 9])]
    return step_inputs(rows, LIMITS, torch.device("cpu"))


def capture(model: Any, inputs: tuple[torch.Tensor, ...], *, mutations: bool = False) -> Captured:
    """The lowered aten graph of one step call (collectives fused: ``fuse_collectives``)."""
    found: list[Captured] = []

    def compiler(gm: fx.GraphModule, _inputs: Any) -> Any:
        fuse_collectives(gm)
        found.append(Captured(gm, mutation_outputs(gm)))
        return gm.forward

    backend = aot_autograd(fw_compiler=compiler, keep_inference_input_mutations=mutations)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(paged_step(model), backend=backend, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    [graph] = found
    return graph


@functools.cache
def captured(moe: bool, step: str) -> Captured:
    """The graph of one step (``decode`` or ``prefill``), captured once per test session: for
    tests that only read it."""
    inputs = decode_inputs() if step == "decode" else prefill_inputs()
    return capture(paged_model(moe), inputs)


def run_step(
    model: Any, inputs: tuple[torch.Tensor, ...], *, rewrite: bool = True
) -> tuple[torch.Tensor, list[bool], fx.GraphModule]:
    """One compiled step, its graph run as is (``rewrite``: pool writes rewritten in place by
    ``keep_pool_writes_in_pytorch``) -> (logits, for each mutation output: whether it is the
    input's own storage, so that AOTAutograd's copy-back copies nothing; the graph)."""
    from torch._guards import TracingContext

    from torch_tensorrt_dist.conversion.layers.paged_kv import keep_pool_writes_in_pytorch

    aliased: list[bool] = []
    graphs: list[fx.GraphModule] = []

    def compiler(gm: fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)
        meta = TracingContext.get().fw_metadata
        mutated = list(meta.mutated_inp_runtime_indices)
        if rewrite:
            keep_pool_writes_in_pytorch(gm, mutation_outputs(gm))

        def run(*args: Any) -> Any:
            out = gm(*args)
            for j, i in enumerate(mutated):
                aliased.append(out[j].data_ptr() == args[i].data_ptr())
            return out

        return run

    backend = aot_autograd(fw_compiler=compiler, keep_inference_input_mutations=False)
    torch._dynamo.reset()
    with torch.no_grad():
        logits = torch.compile(paged_step(model), backend=backend, fullgraph=True)(*inputs)
    torch._dynamo.reset()
    return logits, aliased, graphs[0]
