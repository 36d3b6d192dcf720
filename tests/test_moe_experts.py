"""The grouped MoE experts op: sorted dispatch, exactness against the dense form on every EP
shard, other ranks' rows skipped, one compiled graph in float32, the TensorRT decision."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.conversion.layers.moe_experts import (
    MoELayerEnvironment,
    moe_layer_decision,
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
        (torch.bfloat16, ENV(None, (10, 0)), False, "no TensorRT here"),
        (torch.bfloat16, ENV((10, 15, 1), (10, 0)), False, "TensorRT 10.15.1 has no MoE layer"),
        (torch.bfloat16, ENV((11, 1, 0), None), False, "no CUDA GPU here"),
        (torch.bfloat16, ENV((11, 1, 0), (9, 0)), False, "this GPU is SM 9.0"),
        (torch.bfloat16, ENV((11, 1, 0), (12, 0)), False, "this GPU is SM 12.0"),
        (torch.float32, ENV((11, 1, 0), (10, 0)), False, "float32 experts are not converted"),
        (torch.bfloat16, ENV((10, 16, 0), (10, 0)), True, "IMoELayer"),
        (torch.float16, ENV((11, 1, 0), (11, 0)), True, "IMoELayer"),
    ],
)
def test_moe_layer_decision(dtype: torch.dtype, env: Any, ok: bool, reason: str) -> None:
    decision = moe_layer_decision(dtype, env)
    assert decision.convertible is ok and decision.reason.startswith(reason), decision
    if not ok and "float32" not in reason:
        assert "SM 10.x or 11.x (Blackwell, Thor)" in decision.reason


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

    hf = {"prefill_256": run(0.1), "prefill_1000": run(0.3),
          "decode": {"tokens": [1, 2], "s_per_step": 0.02}}  # fmt: skip
    ours = {"prefill_256": run(0.1), "prefill_1000": run(0.25, 2e-5), "prefill_256_dense": run(0.3),
            "decode_auto": {"tokens": [1, 2], "s_per_step": 0.01},
            "decode_grouped": {"tokens": [1, 2], "s_per_step": 0.015}}  # fmt: skip
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
    ranks = [{k: {**v, "logits": v["logits"].tolist()} if k.startswith("prefill") else v
              for k, v in ours.items()} for _ in range(2)]  # fmt: skip
    ranks[1]["prefill_256"] = {**ranks[1]["prefill_256"], "s": [0.3, 0.1]}
    ep = _ep_result(ranks)
    assert ep["prefill_256"]["s"] == [0.3, 0.2]  # the slower rank of each run
    assert [f.met for f in _figures("m", hf, ep, speed_goals=False)][:1] == [None]
