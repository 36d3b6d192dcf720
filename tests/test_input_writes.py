"""KV-cache writes: in place (index_copy into the cache input) or copied back whole.

The static-cache forward of the Llama model (pipeline stages, perplexity) fills every cache row,
so its captured graph writes the caches with ``index_copy(<cache input>, ...)``; the paged
step writes its tokens into the block pools with ``index_put``. ``explain`` counts those
writes, and the eager engine performs them in place. A request with fewer rows than the static
cache goes through a view and costs a whole-cache copy per call, and the report says so.
"""

from __future__ import annotations

import torch

import torch_tensorrt_dist
from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.generation import runner
from torch_tensorrt_dist.generation.runner import compile_step
from torch_tensorrt_dist.lowering.input_writes import input_writes, reinplace_input_writes
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer

from ._shared_steps import shared_decode_example as decode_example
from ._shared_steps import shared_decode_step as decode_step

ARGS = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64)
CACHE_LEN = 16


def _model(rows: int) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    model.setup_caches(rows, CACHE_LEN)
    return model


def _cache_bytes(model: Transformer) -> int:
    cache = model.blocks[0].attention.kv_cache
    assert cache is not None
    return cache.k_cache.numel() * cache.k_cache.element_size()


def test_full_batch_decode_writes_only_the_new_slot() -> None:
    model = _model(rows=2)
    report = torch_tensorrt_dist.explain(decode_step(model), *decode_example(2, slot=3))
    [graph] = report.graphs
    # k and v of each layer: one [2, H_kv=2, 1, D=8] fp32 slot each
    assert [w.in_place for w in graph.input_writes] == [True] * 4
    assert [w.bytes for w in graph.input_writes] == [2 * 2 * 1 * 8 * 4] * 4
    assert graph.copied_back == []
    assert "4 in place (512 B per call), 0 copied back" in str(report)


def test_paged_steps_write_only_their_tokens_in_place() -> None:
    """The generation core's decode (3 rows, each in its own blocks) and prefill (one 16-token
    chunk) write their tokens into the block pools: explain shows 0 bytes copied back, and the
    bytes written are the tokens', not the pool's (dynamic dimensions: at the example sizes)."""
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    runner.setup_example(model, 3, 64)
    decode = torch_tensorrt_dist.explain(runner.paged_step(model), *runner.decode_example(3))
    prefill = torch_tensorrt_dist.explain(runner.paged_step(model), *runner.prefill_example(16))
    # per layer, k and v: [3 tokens, H_kv=2, D=8] fp32 for decode, [16 tokens, 2, 8] for prefill
    for report, size in ((decode, 3 * 2 * 8 * 4), (prefill, 16 * 2 * 8 * 4)):
        [graph] = report.graphs
        assert [(w.in_place, w.bytes) for w in graph.input_writes] == [(True, size)] * 4
        assert f"4 in place ({4 * size:,} B per call), 0 copied back whole (0 B" in str(report)


def test_fewer_rows_than_the_cache_copy_the_whole_cache_back() -> None:
    model = _model(rows=4)
    report = torch_tensorrt_dist.explain(decode_step(model), *decode_example(2, slot=3))
    [graph] = report.graphs
    assert len(graph.copied_back) == 4 and graph.written_in_place == []
    assert all(w.bytes == _cache_bytes(model) for w in graph.copied_back)


def test_eager_engine_writes_the_cache_in_place_with_the_reference_values() -> None:
    reference, compiled_model = _model(rows=2), _model(rows=2)
    step = compile_step(decode_step(compiled_model), "eager")
    plain = decode_step(reference)
    with recording() as graphs, torch.no_grad():
        for slot in (3, 4):
            inputs = decode_example(2, slot=slot)
            inputs[0].fill_(slot)  # some token
            torch.testing.assert_close(step(*inputs), plain(*inputs))
    assert [len(g.written_in_place) for g in graphs] == [4]
    for got, want in zip(compiled_model.blocks, reference.blocks):
        a, b = got.attention.kv_cache, want.attention.kv_cache
        assert a is not None and b is not None
        torch.testing.assert_close(a.k_cache, b.k_cache, rtol=0, atol=0)
        torch.testing.assert_close(a.v_cache, b.v_cache, rtol=0, atol=0)
        assert a.k_cache[:, :, 3:5].abs().sum() > 0  # both steps landed


def _graph(later_reader: bool) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    cache = graph.placeholder("cache")
    idx = graph.placeholder("idx")
    val = graph.placeholder("val")
    aten = torch.ops.aten
    new = graph.call_function(aten.index_copy.default, (cache, 0, idx, val))
    read = graph.call_function(aten.sum.default, (new,))
    if later_reader:  # reads the OLD cache after the write: may not become in place
        read = graph.call_function(
            aten.add.Tensor, (read, graph.call_function(aten.sum.default, (cache,)))
        )
    graph.call_function(aten.copy_.default, (cache, new))
    graph.output(read)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    for node, value in zip(
        gm.graph.nodes, (torch.zeros(4, 3), torch.tensor([1]), torch.ones(1, 3))
    ):
        node.meta["val"] = value
    return gm


def test_reinplace_rewrites_only_safe_writes() -> None:
    safe = _graph(later_reader=False)
    assert reinplace_input_writes(safe) == 1
    assert [w.in_place for w in input_writes(safe)] == [True]
    cache = torch.zeros(4, 3)
    out = safe(cache, torch.tensor([1]), torch.ones(1, 3))
    assert out.item() == 3 and cache[1].tolist() == [1.0, 1.0, 1.0]

    unsafe = _graph(later_reader=True)
    assert reinplace_input_writes(unsafe) == 0
    assert [w.in_place for w in input_writes(unsafe)] == [False]
    cache = torch.zeros(4, 3)
    assert unsafe(cache, torch.tensor([1]), torch.ones(1, 3)).item() == 3  # old cache: 0
    assert cache[1].tolist() == [1.0, 1.0, 1.0]
