"""The paged step on real TensorRT engines (skipped where TensorRT or a GPU is absent).

Decode and prefill calls, one row and several (the four graphs of R, S and NB dynamic), give the
PyTorch step's logits and leave its pools, call after call. Beyond the numbers (a copy of the
pools would pass them too) the built modules are read: every block write runs in PyTorch as
``index_put_`` on its pool (none is a scatter inside an engine, none functional), each graph
is one engine followed by the writes (``explain``'s estimate), and the pools are the
same tensors before and after (the writes land in place).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.generation.runner import compile_step, paged_step
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer

from ._trt_checks import detailed_layers, engine_modules, torch_ops_left

pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu]

ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=64)
LIMITS = StepLimits(rows=4, tokens=16, blocks=8, block_size=4)
BLOCKS, BLOCK_SIZE = 24, 4
_aten = torch.ops.aten

#: (tokens, start, blocks) per row, call after call: prefill of two rows (right-padded), decode
#: of both, a one-row prefill chunk and a one-row decode (the four graphs), decode of three
CALLS: list[list[tuple[list[int], int, list[int]]]] = [
    [([5, 6, 7, 8, 9, 10, 11], 0, [1, 2]), ([12, 13, 14], 0, [3])],
    [([20], 7, [1, 2]), ([21], 3, [3])],
    [([30, 31, 32, 33, 34], 0, [4, 5])],
    [([40], 5, [4, 5])],
    [([22], 8, [1, 2, 6]), ([23], 4, [3, 7]), ([41], 6, [4, 5])],
]


def _pools(model: Transformer) -> list[torch.Tensor]:
    out = []
    for block in model.blocks:
        pages = block.attention.kv_pages
        assert pages is not None
        out += [pages.k_pool, pages.v_pool]
    return out


def _assert_same_pools(a: Transformer, b: Transformer) -> None:
    """Every block but the null block 0, where the padding of a step lands (several tokens on
    one slot: which one wins is not defined on a GPU, and nothing reads it unmasked)."""
    for x, y in zip(_pools(a), _pools(b)):
        torch.testing.assert_close(x[1:], y[1:], atol=2e-3, rtol=2e-3)


def _assert_writes_in_place(graphs: list[Any]) -> None:
    assert graphs
    for g in graphs:
        module = g.engine_module
        assert module is not None, "the step was not built by Torch-TensorRT"
        assert torch_ops_left(module, {_aten.index_put_.default}) == 2 * ARGS.n_layers
        assert torch_ops_left(module, {_aten.index_put.default}) == 0
        assert len(engine_modules(module)) == 1 == g.engines  # the writes: a tail in PyTorch


def test_paged_step_on_tensorrt_equals_pytorch_and_writes_the_pools_in_place() -> None:
    torch.manual_seed(0)
    reference = Transformer(ARGS).cuda().eval()
    engine_model = copy.deepcopy(reference)
    for model in (reference, engine_model):
        model.setup_paged(BLOCKS, BLOCK_SIZE, ARGS.max_seq_len)
    pools = _pools(engine_model)
    step = compile_step(paged_step(engine_model), "tensorrt")
    device = torch.device("cuda")
    with torch.no_grad(), recording() as graphs, detailed_layers():
        for rows in CALLS:
            got = step(*step_inputs(rows, LIMITS, device))
            want = reference.paged_step(*step_inputs(rows, LIMITS, device))
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
            _assert_same_pools(engine_model, reference)
    assert len(graphs) == 4  # decode or prefill, one row or several
    _assert_writes_in_place(graphs)
    assert all(a is b for a, b in zip(_pools(engine_model), pools))


def test_generator_on_tensorrt_gives_the_pytorch_tokens() -> None:
    """Requests of different lengths through the generation core (prefill chunks and decode
    rows in one step) on TensorRT engines: the tokens and pools of the PyTorch core."""
    from torch_tensorrt_dist.generation import Generator

    torch.manual_seed(0)
    reference = Transformer(ARGS).cuda().eval()
    engine_model = copy.deepcopy(reference)
    prompts = [[3, 5, 7], list(range(1, 20)), [3, 5, 7, 9, 11], [9, 9]]
    outs = []
    with recording() as graphs:
        for model, engine in ((reference, "none"), (engine_model, "tensorrt")):
            gen = Generator(model, engine=engine, max_batch_size=3, cache_len=48)
            outs.append(gen.generate(prompts, max_new_tokens=6).tokens)
    assert outs[0] == outs[1]
    _assert_writes_in_place(graphs)
    _assert_same_pools(engine_model, reference)
