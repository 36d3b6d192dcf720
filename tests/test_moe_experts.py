"""The grouped MoE experts op: sorted dispatch, exactness against the dense form on every EP
shard, other ranks' rows skipped, one compiled graph in float32, the TensorRT decision."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.conversion.layers.moe_experts import (
    MoELayerEnvironment,
    moe_layer_decision,
    moe_layer_shapes,
)
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe import SparseMoE
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.ops import experts
from torch_tensorrt_dist.ops.experts import EXPERTS_OP, sorted_dispatch


def _moe(dim: int, size: int, experts: int = 8, top_k: int = 3) -> SparseMoE:
    args = ModelArgs(dim=dim, n_layers=1, n_heads=1, vocab_size=64, intermediate_size=size)
    moe = SparseMoE(args, MoEArgs(experts, top_k, size, norm_topk_prob=False))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return moe


def _shard(moe: SparseMoE, full: dict[str, torch.Tensor], start: int, count: int) -> None:
    for k, w in full.items():
        setattr(moe, k, torch.nn.Parameter(w[start : start + count]))
    moe.expert_start = start


def test_sorted_dispatch_groups_rows_by_local_expert_and_puts_other_ranks_last() -> None:
    ids = torch.tensor([[5, 1], [2, 5], [7, 0]])  # 3 tokens, top 2
    order, offsets = sorted_dispatch(ids, 4, 4)  # this rank: experts 4..7
    # local ids 1, -, -, 1, 3, -: expert 5 has rows 0 and 3, expert 7 row 4, the rest last
    assert order.tolist()[:3] == [0, 3, 4] and sorted(order.tolist()[3:]) == [1, 2, 5]
    assert offsets.dtype == torch.int32 and offsets.tolist() == [0, 2, 2, 3]
    order, offsets = sorted_dispatch(ids, 0, 8)  # one rank: every row, stable within a group
    assert order.tolist() == [5, 1, 2, 0, 3, 4] and offsets.tolist() == [1, 2, 3, 3, 3, 5, 5, 6]


@pytest.mark.parametrize("dim,size", [(32, 24), (6, 5)], ids=["grouped_mm", "mm-per-group"])
def test_grouped_equals_dense_on_each_ep_shard_and_computes_only_its_rows(
    dim: int, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(6, 5): strides torch._grouped_mm refuses, so one mm per group. Each EP shard's grouped
    result equals its dense one; the shards add up to the whole layer; a shard multiplies only
    the (token, choice) rows routed to its experts."""
    moe = _moe(dim, size)
    x = torch.randn(2, 5, dim, generator=torch.Generator().manual_seed(1))
    full = {k: getattr(moe, k).data for k in ("w1", "w2", "w3")}
    with torch.no_grad():
        whole = moe(x)  # plain PyTorch, compute "auto": grouped
        ids = torch.topk(torch.softmax(moe.gate(x.reshape(10, dim)), -1), 3).indices
    rows: list[int] = []
    real = experts.grouped_mm

    def counting(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        rows.append(a.shape[0])
        return real(a, b, offsets)

    monkeypatch.setattr(experts, "grouped_mm", counting)
    total = torch.zeros_like(whole)
    for start in (0, 4):
        _shard(moe, full, start, 4)
        out = {}
        for mode in ("dense", "grouped"):
            moe.compute = mode
            with torch.no_grad():
                out[mode] = moe(x)
        torch.testing.assert_close(out["grouped"], out["dense"], atol=1e-6, rtol=1e-6)
        total += out["grouped"]
        mine = int(((ids >= start) & (ids < start + 4)).sum())
        assert rows[-3:] == [mine] * 3, (start, rows)  # gate, up, down: its rows only
    torch.testing.assert_close(total, whole, atol=1e-6, rtol=1e-6)
    # the device path (no host synchronisation: every row through, other ranks' zeroed) too
    h = x.reshape(10, dim)
    top_w, top_i = torch.topk(torch.softmax(moe.gate(h), -1), 3)
    _shard(moe, full, 4, 4)
    with torch.no_grad():
        args = (h, top_i, top_w, moe.w1, moe.w3, moe.w2, 4)
        device = experts.grouped_experts(*args, host_rows=False)
        assert rows[-3:] == [30] * 3  # 10 tokens x top 3
        torch.testing.assert_close(device, experts.grouped_experts(*args, host_rows=True))


def test_auto_is_grouped_in_plain_pytorch_and_for_prefill_routed_for_decode() -> None:
    from torch_tensorrt_dist import explain

    moe = _moe(32, 24)
    assert moe.compute_for(1) == "grouped"  # not compiling: the gather would copy weights
    ops = {}
    for tokens in (1, 6):  # 1 x top 3 <= 8 experts: routed; 6 x 3 > 8: grouped
        report = explain(moe, torch.randn(1, tokens, 32))
        assert report.graph_count == 1 and report.graph_breaks == []
        ops[tokens] = [op.module for op in report.torch_ops]
    assert ops == {1: [], 6: [""]}  # the grouped op, here left to PyTorch (no TensorRT)
    moe.compute = "sparse"
    with pytest.raises(Exception, match="use one of"):
        moe(torch.randn(1, 2, 32))


def test_grouped_mm_itself_cannot_be_traced_in_float32() -> None:
    """Why the op exists: torch 2.14's meta kernel of torch._grouped_mm refuses float32, so it
    cannot go into an fp32 graph; the op's own fake kernel can (the explain test above traces
    it in float32 into one graph)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    offs = torch.tensor([2, 4], dtype=torch.int32)
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(RuntimeError, match="BFloat16"):
        torch._grouped_mm(torch.empty(4, 16), torch.empty(2, 16, 8), offs=offs)


def test_fake_kernel_names_bad_shapes() -> None:
    x, ids, w = torch.randn(3, 8), torch.zeros(3, 2, dtype=torch.long), torch.ones(3, 2)
    w1, w2 = torch.randn(4, 5, 8), torch.randn(4, 8, 5)
    with pytest.raises(ValueError, match=r"w1 and w3 \[E, I, D\], w2 \[E, D, I\]"):
        EXPERTS_OP(x, ids, w, w1, w1, w1, 0)
    with pytest.raises(ValueError, match=r"\[T, k\] for T=3 tokens"):
        EXPERTS_OP(x, ids[:2], w[:2], w1, w1, w2, 0)


ENV = MoELayerEnvironment


@pytest.mark.parametrize(
    "dtype,env,ok,reason",
    [
        (torch.bfloat16, ENV(None, False, (10, 0)), False, "no TensorRT here"),
        (
            torch.bfloat16,
            ENV("10.15.1", False, (10, 0)),
            False,
            "TensorRT 10.15.1 has no MoE layer",
        ),
        (torch.bfloat16, ENV("11.1.0", True, None), False, "no CUDA GPU here"),
        (torch.bfloat16, ENV("11.1.0", True, (9, 0)), False, "this GPU is SM 9.0"),
        (torch.bfloat16, ENV("11.1.0", True, (12, 0)), False, "this GPU is SM 12.0"),
        (torch.float32, ENV("11.1.0", True, (10, 0)), False, "float32 experts are not converted"),
        (torch.bfloat16, ENV("10.16.0", True, (10, 0)), True, "IMoELayer"),
        (torch.float16, ENV("11.1.0", True, (11, 0)), True, "IMoELayer"),
        # the gate is the layer itself, not a version: a build without add_moe is refused
        (torch.float16, ENV("11.1.0", False, (11, 0)), False, "TensorRT 11.1.0 has no MoE layer"),
    ],
)
def test_moe_layer_decision(dtype: torch.dtype, env: Any, ok: bool, reason: str) -> None:
    decision = moe_layer_decision(dtype, env)
    assert decision.convertible is ok and decision.reason.startswith(reason), decision
    if not ok and "float32" not in reason:
        assert "SM 10.x or 11.x (Blackwell, Thor)" in decision.reason


def test_moe_layer_needs_constant_weights_and_takes_one_token_sequences() -> None:
    env = ENV("11.1.0", True, (10, 0))
    refused = moe_layer_decision(torch.bfloat16, env, constant_weights=False)
    assert not refused.convertible and "expert weights are graph inputs" in refused.reason
    # T tokens as T sequences of one (the header: slow when seqLen > 16), k experts each
    assert moe_layer_shapes(300, 64, 2) == ((300, 1, 64), (300, 1, 2), (300, 1, 2))


def _experts_graph(dtype: torch.dtype = torch.float32) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    gen = torch.Generator().manual_seed(0)
    w1, w3 = (torch.randn(8, 24, 32, generator=gen, dtype=dtype) for _ in range(2))
    w2 = torch.randn(8, 32, 24, generator=gen, dtype=dtype)

    def f(
        x: torch.Tensor,
        ids: torch.Tensor,
        scores: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
    ) -> torch.Tensor:
        return EXPERTS_OP(x, ids, scores, a, b, c, 0)  # type: ignore[no-any-return]

    ids = torch.tensor([[0, 3], [2, 7], [5, 5]])
    with torch.no_grad():
        return make_fx(f, tracing_mode="fake")(
            torch.randn(3, 32, dtype=dtype), ids, torch.rand(3, 2), w1, w3, w2
        )


def test_expert_weights_to_freeze_follow_the_decision() -> None:
    """The backend freezes w1/w3/w2 (placeholders 3, 4, 5) of an op that becomes IMoELayer
    here, nothing when the environment keeps it in PyTorch; the validator's decision then sees
    constants."""
    from torch_tensorrt_dist.conversion.layers.moe_experts import (
        frozen_expert_inputs,
        node_moe_decision,
    )
    from torch_tensorrt_dist.lowering.freeze_constants import freeze_inputs

    blackwell, hopper = ENV("11.1.0", True, (10, 0)), ENV("11.1.0", True, (9, 0))
    # float32 experts: not converted, so not frozen either
    assert frozen_expert_inputs(_experts_graph(), blackwell) == []
    gm = _experts_graph(torch.bfloat16)
    node = next(iter(gm.graph.find_nodes(op="call_function", target=EXPERTS_OP)))
    assert "graph inputs" in node_moe_decision(node, blackwell).reason
    assert frozen_expert_inputs(gm, hopper) == []
    assert frozen_expert_inputs(gm, blackwell) == [3, 4, 5]
    real = [
        torch.zeros(p.meta["val"].shape, dtype=p.meta["val"].dtype)
        for p in gm.graph.find_nodes(op="placeholder")
    ]
    assert freeze_inputs(gm, real, real, also=[3, 4, 5]) == [0, 1, 2]
    node = next(iter(gm.graph.find_nodes(op="call_function", target=EXPERTS_OP)))
    assert node_moe_decision(node, blackwell).convertible


def test_plain_compiles_never_probe_tensorrt(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inductor/eager engines lower a MoE graph without asking for TensorRT or the GPU;
    a recorded report (explain) or the TensorRT engine asks."""
    from torch_tensorrt_dist.backend import recording
    from torch_tensorrt_dist.backend.backend import lower_graph
    from torch_tensorrt_dist.backend.settings import CompileSettings
    from torch_tensorrt_dist.conversion.layers import moe_experts

    calls: list[int] = []

    def probe() -> MoELayerEnvironment:
        calls.append(1)
        return ENV(None, False, None)

    monkeypatch.setattr(moe_experts, "moe_layer_environment", probe)
    report = lower_graph(_experts_graph(), CompileSettings.from_options({"engine": "eager"}))
    assert report.torch_ops == [] and calls == []
    with recording():
        report = lower_graph(_experts_graph(), CompileSettings.from_options({"engine": "eager"}))
    assert calls and [op.op for op in report.torch_ops] == ["moe_experts"]
    assert report.torch_ops[0].reason.startswith("no TensorRT here")


def test_collective_schedule_leaves_out_the_experts_op() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_tensorrt_dist.artifacts.fingerprint import collective_schedule

    moe = _moe(32, 24)
    moe.compute = "grouped"
    with torch.no_grad():
        gm = make_fx(lambda x: moe(x))(torch.randn(1, 4, 32))
    assert any(n.target is EXPERTS_OP for n in gm.graph.nodes)
    assert collective_schedule(gm) == []


def test_speed_figures_judge_the_goals_from_one_run() -> None:
    """bench --section moe: 256 tokens need >= 1x transformers, 1000 tokens 1.5x, logits within
    1e-5, decode no slower than transformers nor than the grouped form, same greedy tokens."""
    from torch_tensorrt_dist.bench.moe_speed import _ep_result, _figures

    logits = torch.zeros(4)

    def run(s: float, shift: float = 0.0) -> dict[str, Any]:
        return {"logits": logits + shift, "s": [s, 2 * s], "cpu": [s], "compile_s": 1.0}

    hf = {
        "prefill_256": run(0.1),
        "prefill_1000": run(0.3),
        "decode": {"tokens": [1, 2], "s_per_step": 0.02},
    }
    ours = {
        "prefill_256": run(0.1),
        "prefill_1000": run(0.25, 2e-5),
        "prefill_256_dense": run(0.3),
        "decode_auto": {"tokens": [1, 2], "s_per_step": 0.01},
        "decode_grouped": {"tokens": [1, 2], "s_per_step": 0.015},
    }
    got = {f.name.split(": ", 1)[1]: f for f in _figures("m", hf, ours)}
    assert got["prefill 256 tokens, transformers / ours time"].met is True  # 1.0 >= 1.0
    assert got["prefill 1000 tokens, transformers / ours time"].met is False  # 1.2 < 1.5
    assert got["prefill 1000 tokens, transformers / ours time"].value == 1.2
    assert got["prefill 1000 tokens, max |logit - transformers'|"].met is False  # 2e-5
    assert got["prefill 256 tokens, ours dense / ours grouped time"].value == 3.0
    decode = got["decode tok/s, ours / transformers"]
    assert decode.value == 2.0 and decode.met is True and "grouped 67 tok/s" in decode.note
    ours["decode_grouped"]["s_per_step"] = 0.005  # grouped faster: auto did not keep the faster
    assert _figures("m", hf, ours)[-1].met is False
    ranks = [
        {
            k: {**v, "logits": v["logits"].tolist()} if k.startswith("prefill") else v
            for k, v in ours.items()
        }
        for _ in range(2)
    ]
    ranks[1]["prefill_256"] = {**ranks[1]["prefill_256"], "s": [0.3, 0.1]}
    ep = _ep_result(ranks)
    assert ep["prefill_256"]["s"] == [0.3, 0.2]  # the slower rank of each run
    assert [f.met for f in _figures("m", hf, ep, speed_goals=False)][:1] == [None]
