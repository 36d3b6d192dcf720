"""The Llama decode step on a real TensorRT engine at batch 2: logits and KV caches equal the
PyTorch model step after step, and every cache write is TensorRT's in-place update layer: no
write runs in PyTorch, and the engines hold our KV-cache update layers (a fallback to
Torch-TensorRT's scatter would pass the numeric checks too). Skipped where TensorRT or a GPU is
absent."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.generation.generate import compile_step
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer

from ._shared_steps import shared_decode_example as decode_example
from ._shared_steps import shared_decode_step as decode_step
from ._trt_checks import assert_no_fallback, detailed_layers, kv_cache_aliases

ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=64)
_WRITES = {torch.ops.aten.index_put.default, torch.ops.aten.index_copy.default}


def _assert_cache_writes_in_engines(graphs: list[Any]) -> None:
    """Every graph: no KV-cache write left to PyTorch, and one in-place update per cache (k and
    v of each layer) that the engine aliases to its cache input (an ``IKVCacheUpdateLayer``;
    Torch-TensorRT's scatter fallback inside the engine is a copy and aliases nothing)."""
    assert graphs
    for g in graphs:
        assert_no_fallback(g.engine_module, _WRITES, "KV-cache writes")
        assert kv_cache_aliases(g.engine_module) == 2 * ARGS.n_layers


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_decode_on_tensorrt_writes_the_cache_in_place_at_batch_two() -> None:
    torch.manual_seed(0)
    reference = Transformer(ARGS).cuda().eval()
    engine_model = Transformer(ARGS).cuda().eval()
    engine_model.load_state_dict(reference.state_dict())
    for model in (reference, engine_model):
        model.setup_caches(2, 32)
    step = compile_step(decode_step(engine_model), "tensorrt")
    plain = decode_step(reference)
    with torch.no_grad(), recording() as graphs, detailed_layers():
        for slot in range(3, 7):
            tokens, pos, pad = (t.cuda() for t in decode_example(2, slot=slot))
            tokens.fill_(slot)
            torch.testing.assert_close(
                step(tokens, pos, pad), plain(tokens, pos, pad), atol=2e-3, rtol=2e-3
            )
    _assert_cache_writes_in_engines(graphs)
    for got, want in zip(engine_model.blocks, reference.blocks):
        a, b = got.attention.kv_cache, want.attention.kv_cache
        assert a is not None and b is not None
        torch.testing.assert_close(a.k_cache, b.k_cache, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(a.v_cache, b.v_cache, atol=2e-3, rtol=2e-3)


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_generation_core_on_tensorrt_writes_rows_and_slots_in_place() -> None:
    """Requests joining at different steps (slot prefill, per-row decode) on TensorRT engines
    get the tokens and leave the caches of the PyTorch core: every write lands, in place."""
    from torch_tensorrt_dist.generation import Generator

    torch.manual_seed(0)
    reference = Transformer(ARGS).cuda().eval()
    engine_model = Transformer(ARGS).cuda().eval()
    engine_model.load_state_dict(reference.state_dict())
    gens = [
        Generator(m, engine=e, max_batch_size=3, cache_len=32)
        for m, e in ((reference, "none"), (engine_model, "tensorrt"))
    ]
    outs = []
    with recording() as graphs, detailed_layers():
        for gen in gens:
            outs.append(_serve_three(gen))
    assert outs[0] == outs[1]
    _assert_cache_writes_in_engines(graphs)  # the slot prefill and the per-row decode graphs
    for got, want in zip(engine_model.blocks, reference.blocks):
        a, b = got.attention.kv_cache, want.attention.kv_cache
        assert a is not None and b is not None
        torch.testing.assert_close(a.k_cache, b.k_cache, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(a.v_cache, b.v_cache, atol=2e-3, rtol=2e-3)


def _serve_three(gen: Any) -> dict[int, list[int]]:
    """Requests joining at steps 0, 1, 2, each into its own row, decoded together."""
    from torch_tensorrt_dist.generation.slots import Request

    slots, out = gen.slots(), {}
    prompts = {0: [3, 5, 7], 1: list(range(1, 20)), 2: [9, 9]}
    for step in range(8):
        if step in prompts:
            e = slots.join(Request(step, tuple(prompts[step]), 6), slot=2 - step)
            out[step] = e.tokens
        for e in slots.decode():
            out[e.rid] = out[e.rid] + e.tokens
    return out
