"""Which shared-position KV-cache writes (``index_copy``, the form pipeline stages run) become
TensorRT's in-place KV-cache update layer: pure decisions on graphs captured from the Llama
model; the layer itself is built by the ``tensorrt`` tests. The paged step's block writes are
``test_paged_conversion.py``'s."""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

from torch_tensorrt_dist.conversion.layers.kv_cache import kv_cache_write_decision
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer

from ._shared_steps import shared_decode_example as decode_example
from ._shared_steps import shared_decode_step as decode_step
from ._shared_steps import shared_prefill_step as prefill_step

ARGS = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64)


def _writes(fn: Any, *inputs: torch.Tensor) -> list[Any]:
    """The index_copy nodes of the aten graph Torch-TensorRT would see (AOTAutograd's
    default: cache writes returned as outputs)."""
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=capture), fullgraph=True)(*inputs)
    torch._dynamo.reset()
    [gm] = graphs
    return [n for n in gm.graph.nodes if n.target is torch.ops.aten.index_copy.default]


def _model(rows: int) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    model.setup_caches(rows, 16)
    return model


def test_decode_writes_of_every_row_are_taken_for_any_batch() -> None:
    writes = _writes(decode_step(_model(rows=3)), *decode_example(3, slot=5))
    assert len(writes) == 4  # k and v of 2 layers
    decisions = [kv_cache_write_decision(n) for n in writes]
    assert all(d.convertible for d in decisions), decisions
    assert decisions[0].reason == (
        "in-place KV-cache update of 3 row(s), 1 slot(s) from cache_pos[0]"
    )


def test_a_write_through_a_view_of_the_cache_is_left_to_torch_tensorrt() -> None:
    writes = _writes(decode_step(_model(rows=4)), *decode_example(2, slot=5))
    assert writes and all(not kv_cache_write_decision(n).convertible for n in writes)
    assert "not a graph input" in kv_cache_write_decision(writes[0]).reason


def test_prefill_positions_must_be_provably_consecutive() -> None:
    model = _model(rows=2)
    tokens, pad = torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    given = _writes(prefill_step(model), tokens, torch.arange(8), pad)
    assert given and not kv_cache_write_decision(given[0]).convertible
    assert "8 slots at positions that are not an in-graph arange" in (
        kv_cache_write_decision(given[0]).reason
    )

    def prefill_from_zero(tokens: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return model(tokens, torch.arange(tokens.shape[1]), pad, last_only=True)

    made = _writes(prefill_from_zero, tokens, pad)
    assert made and all(kv_cache_write_decision(n).convertible for n in made)


def test_a_cache_with_another_reader_is_not_written_in_place() -> None:
    graph = torch.fx.Graph()
    cache, pos, k = graph.placeholder("cache"), graph.placeholder("pos"), graph.placeholder("k")
    write = graph.call_function(torch.ops.aten.index_copy.default, (cache, 2, pos, k))
    old = graph.call_function(torch.ops.aten.sum.default, (cache,))  # reads the old cache
    graph.output((write, old))
    for node, val in zip(
        graph.nodes,
        (torch.zeros(2, 2, 8, 4), torch.zeros(1, dtype=torch.long), torch.zeros(2, 2, 1, 4)),
    ):
        node.meta["val"] = val
    decision = kv_cache_write_decision(write)
    assert not decision.convertible and "other readers" in decision.reason
