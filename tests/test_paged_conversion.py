"""The paged step under TensorRT, decided without TensorRT: on graphs captured from the real
paged step (dense with grouped-query attention, and MoE), every block write is found and kept
in PyTorch in place (the rewrite computes the same logits and pools, and returns the pools
themselves), the block reads and attention go to the engine, and the engine splits around the
writes only, a tail after the computation (one engine). The engines themselves are built by
the ``tensorrt`` tests."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx

from torch_tensorrt_dist.conversion.layers.paged_forms import (
    attention_form,
    engine_count,
    paged_ops,
)
from torch_tensorrt_dist.conversion.layers.paged_kv import (
    POOL_WRITE_REASON,
    keep_pool_writes_in_pytorch,
    pool_write,
    pool_writes,
)

from ._paged_graphs import (
    ARGS,
    POOL,
    capture,
    captured,
    decode_inputs,
    paged_model,
    prefill_inputs,
    run_step,
)

STEPS = {"decode": decode_inputs, "prefill": prefill_inputs}
L = ARGS.n_layers
#: (moe, step): the dense model's decode and prefill graphs, the MoE model's prefill
GRAPHS = [(False, "decode"), (False, "prefill"), (True, "prefill")]
IDS = ["dense-decode", "dense-prefill", "moe-prefill"]


@pytest.mark.parametrize(("moe", "step"), GRAPHS, ids=IDS)
def test_every_block_write_is_found_and_runs_in_pytorch_in_place(moe: bool, step: str) -> None:
    graph = captured(moe, step)
    writes = pool_writes(graph.gm, graph.outputs)
    assert len(writes) == 2 * L  # k and v of each layer
    tokens = 2 if step == "decode" else 2 * 7  # R * S: two rows, padded to the longest
    item = 4  # float32
    for w in writes:
        assert w.in_place and w.reason == POOL_WRITE_REASON
        assert (w.pool_shape, w.tokens) == (POOL, tokens)
        assert w.write_bytes == tokens * POOL[2] * POOL[3] * item
        assert w.pool_bytes == POOL[0] * POOL[1] * POOL[2] * POOL[3] * item
    assert len({w.pool for w in writes}) == 2 * L  # one pool each
    assert "IKVCacheUpdateLayer updates a linear cache" in POOL_WRITE_REASON
    assert "a copy of the whole pool per call" in POOL_WRITE_REASON


@pytest.mark.parametrize(("moe", "step"), [(False, "decode"), (True, "prefill")])
def test_rewritten_writes_give_the_pytorch_step_and_return_the_pools_themselves(
    moe: bool, step: str
) -> None:
    model = paged_model(moe)
    reference = copy.deepcopy(model)
    functional = copy.deepcopy(model)
    inputs = STEPS[step]()
    logits, aliased, gm = run_step(model, inputs)
    with torch.no_grad():
        want = reference.paged_step(*inputs)
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    for got, ref in zip(model.blocks, reference.blocks):
        assert got.attention.kv_pages is not None and ref.attention.kv_pages is not None
        assert torch.equal(got.attention.kv_pages.k_pool, ref.attention.kv_pages.k_pool)
        assert torch.equal(got.attention.kv_pages.v_pool, ref.attention.kv_pages.v_pool)
    assert aliased == [True] * (2 * L)  # in place: the copy-back copies a pool onto itself
    # the writes became index_put_ (and nothing else changed target): found again, in place
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.index_put_.default) == 2 * L
    assert torch.ops.aten.index_put.default not in targets
    assert all(w.in_place for w in pool_writes(gm, ()))
    assert keep_pool_writes_in_pytorch(gm, ()) == []
    if moe:
        return
    # the control: the functional graph returns new pools, which AOTAutograd copies back
    logits, aliased, _ = run_step(functional, inputs, rewrite=False)
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    assert aliased == [False] * (2 * L)


def test_the_eager_form_is_found_and_left_to_its_own_reinplacing() -> None:
    """With the mutations kept in the graph (eager, Inductor, explain) the writes are
    ``copy_(pool, index_put(pool, ...))``: found without the tracing context, not rewritten."""
    graph = capture(paged_model(), decode_inputs(), mutations=True)
    assert graph.outputs == frozenset()
    writes = pool_writes(graph.gm, ())
    assert len(writes) == 2 * L and all(w.in_place for w in writes)
    assert keep_pool_writes_in_pytorch(graph.gm, ()) == []


def _write_graph(*, reader: bool = False, returned: bool = True, accumulate: bool = False):
    """pool [4, 2, 1, 3], two tokens written; ``reader``: another op reads the old pool."""
    g = fx.Graph()
    pool, blk, off, k = (g.placeholder(n) for n in ("pool", "blk", "off", "k"))
    write = g.call_function(torch.ops.aten.index_put.default, (pool, [blk, off], k, accumulate))
    outs = [write] if returned else []
    if reader:
        outs.append(g.call_function(torch.ops.aten.sum.default, (pool,)))
    outs.append(g.call_function(torch.ops.aten.sum.default, (write,)))
    g.output(tuple(outs))
    vals = (
        torch.zeros(4, 2, 1, 3),
        torch.zeros(2, dtype=torch.long),
        torch.zeros(2, dtype=torch.long),
        torch.ones(2, 1, 3),
    )
    for node, val in zip(g.nodes, vals):
        node.meta["val"] = val
    write.meta["val"] = vals[0]
    return fx.GraphModule(torch.nn.Module(), g), write


def test_a_pool_read_before_its_write_is_left_to_torch_tensorrts_scatter() -> None:
    gm, write = _write_graph(reader=True)
    found = pool_write(write, {write})
    assert found is not None and not found.in_place
    assert "sum_default also read(s) the pool pool" in found.reason
    assert "a copy of the whole pool (96 B) per call" in found.reason
    assert keep_pool_writes_in_pytorch(gm, {write}) == []
    assert write.target is torch.ops.aten.index_put.default


def test_a_functional_index_put_that_is_not_the_pools_new_value_is_not_a_block_write() -> None:
    gm, write = _write_graph()
    assert pool_write(write, ()) is None  # the program asked for a new tensor
    assert keep_pool_writes_in_pytorch(gm, ()) == []
    _, accumulating = _write_graph(accumulate=True)
    assert pool_write(accumulating, {accumulating}) is None


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_the_engine_splits_around_the_writes_only(moe: bool) -> None:
    """One engine for the dense model (the writes are a tail after the last layer); the MoE
    experts op, left to PyTorch without TensorRT, splits the graph at each sparse layer."""
    from torch_tensorrt_dist.backend.report import torch_ops_in

    graph = captured(moe, "prefill")
    writes = {w.node for w in pool_writes(graph.gm, graph.outputs)}
    assert engine_count(graph.gm, writes) == 1
    assert engine_count(graph.gm, set()) == 1
    if moe:
        experts = {op.node for op in torch_ops_in(graph.gm) if op.op == "moe_experts"}
        assert len(experts) == L
        assert engine_count(graph.gm, writes | experts) == L + 1


@pytest.mark.parametrize(("moe", "step"), GRAPHS, ids=IDS)
def test_block_reads_and_attention_go_to_the_engine(moe: bool, step: str) -> None:
    graph = captured(moe, step)
    ops = paged_ops(graph.gm, graph.outputs)
    kinds = [op.kind for op in ops]
    # each layer reads its past blocks and attends; the writes come after every layer
    assert kinds == ["block read", "block read", "attention"] * L + ["block write"] * (2 * L)
    forms = {(op.kind, op.form, op.in_engine) for op in ops}
    assert forms == {
        ("block write", "PyTorch, in place", False),
        ("block read", "IGatherLayer (axis 0)", True),
        ("attention", "IAttention", True),
    }
    attention = [op for op in ops if op.kind == "attention"]
    assert all("traced on CPU" in op.reason for op in attention)


def _sdpa(
    target: object, q: tuple[int, ...], kv: tuple[int, ...], v: tuple[int, ...] | None = None
):
    g = fx.Graph()
    nodes = [g.placeholder(n) for n in ("q", "k", "v", "mask")]
    for node, shape in zip(nodes, (q, kv, v or kv, (q[0], 1, q[2], kv[2]))):
        node.meta["val"] = torch.zeros(shape)
    call = g.call_function(target, (*nodes[:3], nodes[3], False))  # type: ignore[arg-type]
    g.output(call)
    return call


def test_cuda_attention_variants_become_iattention_with_the_mask() -> None:
    """What a CUDA trace holds: the efficient (or cuDNN) kernel with the bias, q folded to
    [R, H_kv, rep * S, D] against k, v [R, H_kv, NB * bs, D]."""
    aten = torch.ops.aten
    for target in (
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten.scaled_dot_product_attention.default,
    ):
        form = attention_form(_sdpa(target, (3, 2, 2 * 5, 8), (3, 2, 32, 8)))
        assert form is not None and form.in_engine and form.form == "IAttention"
        assert "a mask, no key/value lengths" in form.reason
    refused = attention_form(
        _sdpa(aten.scaled_dot_product_attention.default, (3, 4, 5, 8), (3, 2, 32, 8))
    )
    assert refused is not None and not refused.in_engine
    assert "validator refuses" in refused.reason
    mismatched = attention_form(
        _sdpa(aten.scaled_dot_product_attention.default, (3, 2, 5, 8), (3, 2, 32, 8), (3, 2, 16, 8))
    )
    assert mismatched is not None and not mismatched.in_engine


def test_explain_says_what_stays_in_pytorch_and_how_many_engines() -> None:
    import torch_tensorrt_dist
    from torch_tensorrt_dist.generation.runner import paged_step

    report = torch_tensorrt_dist.explain(paged_step(paged_model()), *prefill_inputs())
    [graph] = report.graphs
    assert [op.op for op in report.torch_ops] == ["index_put (KV block write)"] * (2 * L)
    assert {op.reason for op in report.torch_ops} == {POOL_WRITE_REASON}
    assert [op.module for op in report.torch_ops][::2] == [
        f"layers.{i}.attention.kv_pages" for i in range(L)
    ]
    assert graph.engines == 1
    text = str(report)
    assert (
        f"graph 0 paged KV under TensorRT: {2 * L} block read -> IGatherLayer (axis 0); "
        f"{L} attention -> IAttention; {2 * L} block write -> PyTorch, in place"
    ) in text
    assert f"{2 * L} op(s) stay in PyTorch, with 1 TensorRT engine around them:" in text
    assert "layers.0.attention.kv_pages, layers.1.attention.kv_pages: a KV block write" in text
    as_dict = report.as_dict()
    assert len(as_dict["torch_ops"]) == 2 * L
