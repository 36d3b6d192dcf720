"""Our converters with dynamic dimensions (R, S, NB of the paged step), decided without
TensorRT: the gather, weight-only and MoE converters take graphs whose token count is symbolic
(and say so to Torch-TensorRT), and a collective over a dynamic dim 0 converts where TensorRT's
equal blocks fit every size it may take, else stays in PyTorch with the reason."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from torch_tensorrt_dist.backend.fake_world import fake_world
from torch_tensorrt_dist.conversion.capability import node_decision
from torch_tensorrt_dist.conversion.layers import LAYERS
from torch_tensorrt_dist.conversion.layers.gather import gather_decision
from torch_tensorrt_dist.conversion.layers.moe_experts import (
    MoELayerEnvironment,
    node_moe_decision,
)
from torch_tensorrt_dist.conversion.layers.weight_only import INT8_OP, weight_only_decision
from torch_tensorrt_dist.conversion.node_args import collective_calls, row_of
from torch_tensorrt_dist.lowering import fuse_collectives
from torch_tensorrt_dist.lowering.sizes import is_symbolic
from torch_tensorrt_dist.ops.experts import EXPERTS_OP

from ._paged_graphs import (
    ARGS,
    BLOCK_SIZE,
    BLOCKS,
    capture,
    captured,
    decode_inputs,
    paged_model,
    prefill_inputs,
)

GRAPHS = [(False, "decode"), (False, "prefill"), (True, "prefill")]


def _calls(gm: fx.GraphModule, target: object) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def test_layer_converters_declare_dynamic_shapes_where_their_bodies_take_them() -> None:
    dynamic = {row.target: row.supports_dynamic_shapes for row in LAYERS}
    assert dynamic[torch.ops.aten.gather.default] is True
    assert dynamic[INT8_OP] is True and dynamic[EXPERTS_OP] is True
    # the shared-position index_copy write needs a static cache (its decision says so)
    assert dynamic[torch.ops.aten.index_copy.default] is False
    # the paged block writes have no converter of ours: they stay in PyTorch (paged_kv.py)
    assert torch.ops.aten.index_put.default not in dynamic


@pytest.mark.parametrize(("moe", "step"), GRAPHS)
def test_every_gather_of_the_paged_step_is_an_element_gather(moe: bool, step: str) -> None:
    gathers = _calls(captured(moe, step).gm, torch.ops.aten.gather.default)
    # each row's last token (a token's block comes as an input: no gather)
    assert len(gathers) == 1
    assert all(is_symbolic(g.meta["val"]) for g in gathers)
    assert {gather_decision(g) for g in gathers} == {(True, "IGatherLayer (ELEMENT) on dim 1")}


def _gather_node(x: tuple[int, ...], index: tuple[int, ...], dim: int = 1) -> fx.Node:
    g = fx.Graph()
    a, b = g.placeholder("x"), g.placeholder("index")
    a.meta["val"], b.meta["val"] = torch.zeros(x), torch.zeros(index, dtype=torch.long)
    node = g.call_function(torch.ops.aten.gather.default, (a, dim, b))
    g.output(node)
    return node


def test_gathers_torch_allows_but_the_element_gather_cannot_be_sure_of_are_refused() -> None:
    assert gather_decision(_gather_node((2, 5), (2, 9))).convertible  # any size along dim
    assert gather_decision(_gather_node((2, 5), (1, 3))).convertible  # smaller elsewhere
    wider = gather_decision(_gather_node((2, 5), (3, 2)))
    assert not wider.convertible and "index dim 0 (3) may exceed the input's" in wider.reason
    rank = gather_decision(_gather_node((2, 5), (2,), dim=0))
    assert not rank.convertible and "index of rank 1 for input of rank 2" in rank.reason


def test_weight_only_matmuls_of_a_dynamic_step_convert() -> None:
    from torch_tensorrt_dist.quantization import QuantConfig, quantize_model

    model = paged_model()
    quantize_model(model, QuantConfig("int8"), engine="tensorrt")
    gm = capture(model, prefill_inputs()).gm
    matmuls = _calls(gm, INT8_OP)
    assert len(matmuls) == 7 * 2  # q, k, v, o, gate, up, down of 2 layers
    assert all(is_symbolic(n.args[0].meta["val"]) for n in matmuls)  # M = R * S
    decisions = {
        weight_only_decision(n, tensorrt_version=(11, 1), require_constants=False) for n in matmuls
    }
    assert all(d.convertible for d in decisions), decisions


def test_grouped_experts_of_a_dynamic_step_become_imoelayer_where_the_gpu_has_it() -> None:
    calls = _calls(captured(True, "prefill").gm, EXPERTS_OP)
    assert len(calls) == 2
    hidden = calls[0].args[0]
    assert isinstance(hidden, fx.Node) and is_symbolic(hidden.meta["val"])  # T = R * S tokens
    blackwell = MoELayerEnvironment("11.1.0", True, (10, 0))
    # float32 here: the layer is documented for half precision, so the decision says so
    refused = node_moe_decision(calls[0], blackwell, require_constants=False)
    assert not refused.convertible and "float32 experts are not converted" in refused.reason
    val = hidden.meta["val"]
    try:  # the same dynamic call in bfloat16 (the captured graph is shared: restored after)
        hidden.meta["val"] = val.to(torch.bfloat16)
        assert node_moe_decision(calls[0], blackwell, require_constants=False).convertible
    finally:
        hidden.meta["val"] = val


def test_tp_collectives_of_a_dynamic_step_convert() -> None:
    from torch_tensorrt_dist.parallel.llama import apply_tp

    with fake_world(1, 2):
        model = paged_model()
        apply_tp(model, dist.group.WORLD)
        model.setup_paged(BLOCKS, BLOCK_SIZE, ARGS.max_seq_len)  # this rank's KV heads
        gm = capture(model, decode_inputs()).gm
        calls = collective_calls(gm)
        assert [c.op for c in calls] == ["all_reduce"] * 5 + ["all_gather"]
        assert all(c.dim0 is None for c in calls)  # R is dynamic: not known at build time
        for node in gm.graph.nodes:
            if node.op == "call_function" and row_of(node.target) is not None:
                for impl in ("native", "torch_nccl"):
                    assert node_decision(node, impl).convertible, node


def _traced(fn: object, rows: int) -> fx.GraphModule:
    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(rows, 4))  # type: ignore[arg-type]
    fuse_collectives(gm)
    return gm


def test_a_dynamic_dim_0_must_split_evenly_for_every_size() -> None:
    """Traced through c10d, a reduce_scatter carries torch's guard that dim 0 divides evenly
    (``Eq(Mod(s0, 2), 0)``): provable, so it converts. A graph without that fact (built by
    hand here) leaves it in PyTorch rather than let TensorRT split an odd size."""
    from torch_tensorrt_dist.ops.collectives import COLLECTIVE_OPS

    with fake_world(0, 2):
        group = dist.group.WORLD
        assert group is not None

        def scatter(x: torch.Tensor) -> torch.Tensor:
            return funcol.reduce_scatter_tensor(x, "sum", 0, group)

        gm = _traced(scatter, 6)
        [node] = [n for n in gm.graph.nodes if row_of(n.target) is not None]
        assert node_decision(node, "native").convertible
        # the same op on a symbolic dim 0 nothing constrains
        free = make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(6, 4))
        x = next(iter(free.graph.find_nodes(op="placeholder")))
        op = COLLECTIVE_OPS["reduce_scatter"]
        with free.graph.inserting_after(x):
            call = free.graph.call_function(op, (x, "sum", group.group_name, [0, 1]))
        decision = node_decision(call, "native")
        assert not decision.convertible
        assert "dynamic dim 0 that is not divisible by 2" in decision.reason


def test_dynamic_split_sizes_keep_an_all_to_all_in_pytorch() -> None:
    with fake_world(0, 2):
        group = dist.group.WORLD

        def exchange(x: torch.Tensor) -> torch.Tensor:
            half = x.shape[0] // 2
            return funcol.all_to_all_single(x, [half, half], [half, half], group)

        gm = _traced(exchange, 6)
        [node] = [n for n in gm.graph.nodes if row_of(n.target) is not None]
        decision = node_decision(node, "native")
        assert not decision.convertible and "dynamic split sizes" in decision.reason
        assert collective_calls(gm) == []  # left out of the engine's groups, not an error
