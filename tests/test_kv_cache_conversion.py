"""Which KV-cache writes become TensorRT's in-place KV-cache update layer (pure decisions on
graphs captured from the Llama model; the layer itself is built by the ``tensorrt`` tests)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from torch_tensorrt_dist.conversion.layers.kv_cache import kv_cache_write_decision
from torch_tensorrt_dist.conversion.layers.kv_cache_rows import KVPut, kv_cache_put_form
from torch_tensorrt_dist.generation import generate
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


def _puts(fn: Any, *inputs: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The index_put nodes of the aten graph Torch-TensorRT would see."""
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=capture), fullgraph=True)(*inputs)
    torch._dynamo.reset()
    [gm] = graphs
    return gm, [n for n in gm.graph.nodes if n.target is torch.ops.aten.index_put.default]


def _fold_aranges(gm: torch.fx.GraphModule) -> int:
    """Replace each in-graph arange by a constant, as Torch-TensorRT's constant folding does."""
    folded = 0
    for node in list(gm.graph.nodes):
        if node.target is torch.ops.aten.arange.default:
            gm.register_buffer(f"_folded_{folded}", torch.arange(node.args[0]))
            with gm.graph.inserting_before(node):
                const = gm.graph.get_attr(f"_folded_{folded}")
            const.meta["val"] = node.meta["val"]
            node.replace_all_uses_with(const)
            gm.graph.erase_node(node)
            folded += 1
    gm.recompile()
    return folded


def test_the_generation_cores_writes_are_taken_in_both_forms() -> None:
    """Decode writes every row at its own position; prefill writes one row from position 0."""
    model = _model(rows=3)
    _, decode = _puts(generate.decode_step(model), *generate.decode_example(3, slot=5))
    assert len(decode) == 4  # k and v of 2 layers
    assert {kv_cache_put_form(n) for n in decode} == {
        KVPut("rows", "in-place KV-cache update of every row (3) at its own position")
    }
    gm, prefill = _puts(generate.prefill_step(model), *generate.prefill_example(8, slot=1))
    assert [kv_cache_put_form(n).form for n in prefill] == ["slot"] * 4
    assert "one row of 3, positions [0, 8) (packed update)" in kv_cache_put_form(prefill[0]).reason
    assert _fold_aranges(gm) > 0  # the folded constants are still recognised
    assert [kv_cache_put_form(n).form for n in prefill] == ["slot"] * 4


def test_index_puts_that_are_not_cache_writes_are_left_to_torch_tensorrt() -> None:
    def put(
        cache: torch.Tensor,
        rows: torch.Tensor,
        pos: torch.Tensor,
        v: torch.Tensor,
        accumulate: bool = False,
    ) -> torch.Tensor:
        return torch.ops.aten.index_put.default(cache, [rows, None, pos], v, accumulate)

    cache, v = torch.zeros(2, 2, 8, 4), torch.ones(2, 2, 4)
    _, [accumulating] = _puts(
        lambda c, p: put(c, torch.arange(2), p, v, True), cache, torch.tensor([1, 2])
    )
    assert "accumulating" in kv_cache_put_form(accumulating).reason
    _, [some_rows] = _puts(
        lambda c, r, p: put(c, r, p, v), cache, torch.tensor([1, 0]), torch.tensor([1, 2])
    )
    assert kv_cache_put_form(some_rows).form is None  # rows given by an input, not arange
    _, [scattered] = _puts(
        lambda c, s: put(c, s.expand(3), torch.tensor([0, 2, 5]), torch.ones(3, 2, 4)),
        cache,
        torch.tensor([1]),
    )
    assert "neither every row" in kv_cache_put_form(scattered).reason  # not positions [0, S)

    def read_too(c: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        old = c.sum()
        return put(c, torch.arange(2), p, v) + old

    _, [shared] = _puts(read_too, cache, torch.tensor([1, 2]))
    assert "other readers" in kv_cache_put_form(shared).reason


def test_a_prefill_slot_must_be_a_row_of_the_cache() -> None:
    """The packed update's lengths give the slot's row every token; a slot past the last row
    would leave them ending in 0 (undefined in TensorRT): refused where the graph holds it."""
    from torch_tensorrt_dist.conversion.layers.kv_cache_rows import (
        check_slot,
        kv_cache_put_decision,
        slot_update_lengths,
    )

    assert slot_update_lengths(3, 1, 8) == [0, 0, 8, 8]  # row 1 gets lengths[2] - lengths[1]
    assert slot_update_lengths(3, 2, 5)[-1] == 5  # the last entry is the update's token count
    with pytest.raises(ValueError, match=r"slot 3 is not a row of a cache of 3 rows"):
        check_slot(3, 3)

    def prefill(cache: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:  # 3 tokens into `slot`
        return torch.ops.aten.index_put.default(
            cache, [slot.expand(3), None, torch.arange(3)], torch.ones(3, 2, 4)
        )

    gm, [put] = _puts(prefill, torch.zeros(3, 2, 8, 4), torch.tensor([1]))
    assert kv_cache_put_decision(put).convertible
    no_packed = kv_cache_put_decision(put, packed_update=False)
    assert not no_packed.convertible and "AttentionIOForm" in no_packed.reason
    slot = put.args[1][0].args[0]  # the [1] slot input that expand() repeats
    for value, ok in ((2, True), (3, False)):
        gm.register_buffer("_slot", torch.tensor([value]))
        with gm.graph.inserting_before(slot):
            const = gm.graph.get_attr("_slot")
        const.meta["val"] = slot.meta["val"]
        slot.replace_all_uses_with(const)
        assert (kv_cache_put_form(put).form == "slot") is ok
        if not ok:
            assert "the slot 3 is not a row of the cache's 3" in kv_cache_put_form(put).reason
        slot = const
