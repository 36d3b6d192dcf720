"""MoE in one process: explain on the fake process group, sliced reads, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.cli import main
from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs, moe_args_from_hf_config
from torch_tensorrt_dist.parallel.moe import MoEGroups, moe_layout
from torch_tensorrt_dist.parallel.moe_load import load_moe

from . import _moe_ckpt

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "mixtral"
    _moe_ckpt.save_checkpoint("mixtral", path)
    return path


def test_explain_ep2_tp4_on_fake_world_of_8(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 5 of --ep 2 --tp 4: one decode graph, attention on TP group [4..7], each MoE
    layer's single all-reduce on the EP x TP group [0..7], named by its module."""
    args = [
        "explain",
        "--model",
        "moe",
        "--world-size",
        "8",
        "--ep",
        "2",
        "--tp",
        "4",
        "--rank",
        "5",
        "--layers",
        "2",
        "--json",
    ]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["ep_rank"], report["tp_rank"], report["experts"]) == (1, 1, [4, 8])
    assert report["decode"]["graph_count"] == 1 and report["decode"]["graph_breaks"] == []
    assert report["groups"] == [[4, 5, 6, 7], list(range(8))]
    assert report["groups_ok"]
    rows = [(c["op"], c["group_ranks"], c["module"]) for c in report["decode"]["collectives"]]
    moe = [r for r in rows if r[1] == list(range(8))]
    assert moe == [("all_reduce", list(range(8)), f"layers.{i}.feed_forward") for i in (0, 1)]
    assert ("all_reduce", [4, 5, 6, 7], "layers.1.attention") in rows
    # decode (2 tokens x top 2 <= 4 local experts) gathers weights: plain TensorRT layers; the
    # prefill's grouped experts op stays in PyTorch without TensorRT, each layer's, with why
    experts = {
        graph: [op for op in report[graph]["torch_ops"] if op["op"] == "moe_experts"]
        for graph in ("decode", "prefill")
    }
    assert experts["decode"] == []
    split = experts["prefill"]
    assert [op["module"] for op in split] == ["layers.0.feed_forward", "layers.1.feed_forward"]
    assert all(op["reason"].startswith("no TensorRT here; IMoELayer needs") for op in split)
    # and every graph's KV block writes (k and v of each layer) stay in PyTorch, in place
    for graph in ("decode", "prefill"):
        writes = [op for op in report[graph]["torch_ops"] if op["op"] != "moe_experts"]
        assert [op["op"] for op in writes] == ["index_put (KV block write)"] * 4


def test_each_ep_rank_reads_only_its_experts(mixtral: Path) -> None:
    """At ep 2 the two ranks read disjoint halves of the expert bytes and all of the rest."""
    full = load_moe(mixtral, progress=False)
    expert = sum(
        p.numel() * 4 for n, p in full.named_parameters() if n.endswith(("w1", "w2", "w3"))
    )
    total = full.bytes_read
    reads = []
    for r in range(2):
        model = load_moe(mixtral, groups=MoEGroups(2, 1, r, 0, None, None), progress=False)
        reads.append(model.bytes_read)
        assert model.sparse_blocks[0].expert_start == 2 * r
        assert list(model.sparse_blocks[0].w2.shape) == [2, 64, 32]
        for name in ("w1", "w3", "w2"):  # the rank's experts, bit for bit
            got = getattr(model.sparse_blocks[1], name)
            torch.testing.assert_close(
                got, getattr(full.sparse_blocks[1], name)[2 * r : 2 * r + 2], rtol=0, atol=0
            )
    assert reads == [total - expert // 2] * 2


def _cfg(**overrides: Any) -> dict[str, Any]:
    _, cfg = _moe_ckpt.CONFIGS["qwen2_moe"]
    return {"model_type": "qwen2_moe", **_moe_ckpt._COMMON, **cfg, **overrides}


def test_qwen2_moe_config_translation() -> None:
    args, moe = moe_args_from_hf_config(_cfg(decoder_sparse_step=1))
    assert (moe.n_experts, moe.top_k, moe.expert_size, moe.shared_expert_size) == (4, 2, 16, 32)
    assert moe.sparse_layers == (0,) and not moe.norm_topk_prob and args.qkv_bias


@pytest.mark.parametrize(
    ("ep", "tp", "overrides", "text"),
    [
        (3, 1, {}, "ep=3 does not divide the 4 experts; use ep in [1, 2, 4]"),
        (1, 3, {}, "tp=3 does not divide the expert FFN size 16"),
        (
            4,
            1,
            {"shared_expert_intermediate_size": 18},
            "ep x tp = 4 does not divide the shared expert FFN size 18",
        ),
        (1, 8, {"moe_intermediate_size": 64}, "n_heads=4 is not divisible by tp=8"),
    ],
)
def test_bad_layouts_name_the_numbers(
    ep: int, tp: int, overrides: dict[str, int], text: str
) -> None:
    args, moe = moe_args_from_hf_config(_cfg(**overrides))
    with pytest.raises(ConfigError, match=text.replace("[", r"\[").replace("]", r"\]")):
        moe_layout(args, moe, ep=ep, tp=tp)


def test_bad_moe_args() -> None:
    with pytest.raises(ConfigError, match="top_k=3 exceeds the 2 experts"):
        MoEArgs(n_experts=2, top_k=3, expert_size=8)
    with pytest.raises(ConfigError, match="model_type='llama'"):
        moe_args_from_hf_config({"model_type": "llama"})


def test_missing_expert_is_named(mixtral: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((mixtral / "config.json").read_text())
    tensors = load_file(str(mixtral / "model.safetensors"))
    for kind in ("w1", "w2", "w3"):
        del tensors[f"model.layers.1.block_sparse_moe.experts.3.{kind}.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(
        CheckpointError,
        match=r"num_local_experts=4, but layer 1 of .* holds "
        r"experts 3 \(0-2\); the config and weights do not match",
    ):
        load_moe(broken, progress=False)
    # every rank checks the whole checkpoint, so ep rank 0 of 2 (experts 0, 1) refuses it too
    # rather than loading and waiting in a collective for the rank that cannot
    with pytest.raises(CheckpointError, match=r"num_local_experts=4, but layer 1"):
        load_moe(broken, groups=MoEGroups(2, 1, 0, 0, None, None), progress=False)


def test_bench_moe_communication_meets_the_minimum() -> None:
    """One all-reduce of batch x hidden per MoE layer; an all-to-all dispatch sends more."""
    from torch_tensorrt_dist.bench.moe import a2a_bytes, moe_communication

    args = ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=128, intermediate_size=64)
    moe = MoEArgs(n_experts=4, top_k=2, expert_size=64, sparse_layers=(1,))
    figures = moe_communication(layouts=((2, 2),), args=args, moe_args=moe)
    assert [f.met for f in figures] == [True, True, True]
    assert figures[2].value == 64 * 2  # hidden 64 in bf16, batch 1
    # dispatch + combine of 2 rows x 2 EP slots, the TP all-reduce, the EP all-gather
    assert a2a_bytes(ep=2, tp=2, tokens=1, dim=256, top_k=2, n_experts=8, itemsize=2) == (
        4,
        2 * (2 * 2 * 256 * 2) + 512 + 256,
    )


def test_routed_compute_equals_dense_and_compiles_to_one_graph() -> None:
    """The decode path (only each token's k choices, weights gathered by index) gives the dense
    path's result on every EP shard, and captures as one graph with no break."""
    from torch_tensorrt_dist import explain
    from torch_tensorrt_dist.models.moe import SparseMoE

    args = ModelArgs(dim=32, n_layers=1, n_heads=4, vocab_size=64, intermediate_size=24)
    moe = SparseMoE(args, MoEArgs(n_experts=8, top_k=3, expert_size=24, norm_topk_prob=False))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x = torch.randn(2, 3, 32, generator=gen)
    full = {k: getattr(moe, k).data for k in ("w1", "w2", "w3")}
    total = torch.zeros(2, 3, 32)
    for start in (0, 4):  # the two EP ranks of ep 2: their partial sums add up to the whole
        for k, w in full.items():
            setattr(moe, k, torch.nn.Parameter(w[start : start + 4]))
        moe.expert_start = start
        outs = {}
        for mode in ("dense", "routed"):
            moe.compute = mode
            outs[mode] = moe(x)
        torch.testing.assert_close(outs["routed"], outs["dense"], atol=1e-5, rtol=1e-5)
        total += outs["dense"]
    for k, w in full.items():
        setattr(moe, k, torch.nn.Parameter(w))
    moe.expert_start, moe.compute = 0, "dense"
    torch.testing.assert_close(total, moe(x), atol=1e-5, rtol=1e-5)
    nodes = {}
    for mode in ("dense", "routed", "auto"):  # auto, compiled, 1 token x top 3 < 8: routed
        moe.compute = mode
        report = explain(moe, torch.randn(1, 1, 32))
        assert report.graph_count == 1 and report.graph_breaks == []
        nodes[mode] = report.graphs[0].num_nodes
    assert nodes["auto"] == nodes["routed"] != nodes["dense"]


def test_experts_fused_on_disk_load_like_per_expert(mixtral: Path, tmp_path: Path) -> None:
    """A checkpoint in transformers' in-memory layout (experts.gate_up_proj [E, 2I, D],
    experts.down_proj [E, D, I], router under .mlp) loads the same weights, reading the same
    bytes: only this rank's experts' blocks."""
    from safetensors.torch import save_file

    from torch_tensorrt_dist.parallel.llama import ShardSlice
    from torch_tensorrt_dist.parallel.moe import MoELayout
    from torch_tensorrt_dist.parallel.moe_load import _fused_slice

    hf = _moe_ckpt.hf_model("mixtral")
    (tmp_path / "config.json").write_text((mixtral / "config.json").read_text())
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(tmp_path / "model.safetensors"))
    for groups in (None, MoEGroups(2, 1, 1, 0, None, None)):
        ref = load_moe(mixtral, groups=groups, progress=False)
        got = load_moe(tmp_path, groups=groups, progress=False)
        for a, b in zip(ref.parameters(), got.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert got.bytes_read == ref.bytes_read
    # at tp 2, rank 1 reads rows 8:16 (gate) and 24:32 (up) of [32, D], columns 8:16 of down
    lay = MoELayout(ep=1, tp=2, ep_rank=0, tp_rank=1, n_experts=4, expert_size=16)
    assert _fused_slice("w1", lay, 16) == ShardSlice(0, 8, 16, 8)
    assert _fused_slice("w3", lay, 16) == ShardSlice(0, 24, 32, 8)
    assert _fused_slice("w2", lay, 16) == ShardSlice(1, 8, 16, 8)
