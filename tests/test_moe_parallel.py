"""MoE at (ep, tp) = (1, 2), (2, 1), (2, 2) on gloo: greedy tokens equal transformers' generate.

One spawn per world size runs every case: world 2 runs (1, 2) and (2, 1) for the Mixtral- and
the Qwen2-MoE-style checkpoint (and (1, 2) for the Qwen3-MoE one), world 4 runs (2, 2) for
both (plain PyTorch: the same functional collectives a compiled graph holds). The compiled
decode graph (one graph, collectives on the TP group and the EP x TP group) is checked on the
fake process group below, in one process: compiling on 4 gloo ranks that share 2 CPU cores
would add about 20 s.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.parallel.moe_load import load_moe
from torch_tensorrt_dist.testing import run_on_ranks

from . import _llama_ckpt, _moe_ckpt

pytest.importorskip("transformers")

NAMES = ("mixtral", "qwen2_moe", "qwen3_moe")
PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7]]
MAX_NEW = 8
LAYOUTS = {2: [(1, 2), (2, 1)], 4: [(2, 2)]}
#: Qwen3-MoE differs from Qwen2-MoE in attention only (per-head q/k norms): TP 2 covers it
ONLY = {"qwen3_moe": [(1, 2)]}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("moe")
    out: dict[str, Any] = {}
    for name in NAMES:
        hf = _moe_ckpt.save_checkpoint(name, root / name)
        with torch.no_grad():
            logits = hf(torch.tensor([PROMPTS[0]])).logits
        out[name] = {
            "path": str(root / name),
            "hf": [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS],
            "logits": logits,
        }
    return out


def _jobs(ckpts: dict[str, Any], world: int) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "path": ckpts[name]["path"],
            "ep": ep,
            "tp": tp,
            "prompts": PROMPTS,
            "max_new_tokens": MAX_NEW,
        }
        for ep, tp in LAYOUTS[world]
        for name in NAMES
        if (ep, tp) in ONLY.get(name, [(ep, tp)])
    ]


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def suite(request: pytest.FixtureRequest, ckpts: dict[str, Any]) -> tuple[int, Any, Any]:
    world = request.param
    jobs = _jobs(ckpts, world)
    return world, jobs, run_on_ranks(_moe_ckpt.moe_suite, world, {"jobs": jobs}, timeout=240)


def test_tp1_logits_and_tokens_equal_transformers(ckpts: dict[str, Any]) -> None:
    from torch_tensorrt_dist.generation import Generator

    for name in NAMES:
        model = load_moe(ckpts[name]["path"], progress=False)
        model.setup_caches(1, 16)
        with torch.no_grad():
            logits = model(torch.tensor([PROMPTS[0]]), torch.arange(len(PROMPTS[0])))
        torch.testing.assert_close(logits, ckpts[name]["logits"], atol=1e-5, rtol=0)
        gen = Generator(model, max_batch_size=1, cache_len=64)
        # plain PyTorch runs grouped (auto), a compiled decode routed; dense is the reference
        for mode in ("dense", "routed", "grouped"):
            for moe in model.sparse_blocks:
                moe.compute = mode
            tokens = [gen.generate([p], max_new_tokens=MAX_NEW).tokens[0] for p in PROMPTS]
            assert tokens == ckpts[name]["hf"], (name, mode)


def test_greedy_tokens_and_logits_equal_transformers(
    suite: tuple[int, Any, Any], ckpts: dict[str, Any]
) -> None:
    world, jobs, results = suite
    for rank in range(world):
        for job, res in zip(jobs, results[rank], strict=True):
            where = (job["name"], job["ep"], job["tp"], rank)
            assert res["tokens"] == ckpts[job["name"]]["hf"], where
            torch.testing.assert_close(
                torch.tensor(res["logits"]), ckpts[job["name"]]["logits"], atol=1e-5, rtol=0
            )


def test_each_rank_holds_and_reads_its_share(
    suite: tuple[int, Any, Any], ckpts: dict[str, Any]
) -> None:
    """Expert weights split 1/(ep x tp), the rest 1/tp (vocabulary shards, router replicated)."""
    world, jobs, results = suite
    for i, job in enumerate(jobs):
        full = load_moe(job["path"], progress=False)
        expert = sum(
            p.numel() * 4 for n, p in full.named_parameters() if n.endswith(("w1", "w2", "w3"))
        )
        rest = sum(p.numel() * 4 for p in full.parameters()) - expert
        bound = expert / (job["ep"] * job["tp"]) + rest / job["tp"]
        for rank in range(world):
            res = results[rank][i]
            assert res["bytes_read"] == res["bytes_held"], (job["name"], rank)
            assert res["bytes_held"] <= 1.10 * bound, (job["name"], rank, res["bytes_held"], bound)


def test_decode_graph_at_ep2_tp2_has_collectives_on_two_groups(ckpts: dict[str, Any]) -> None:
    """The (2, 2) layout of the Qwen2-MoE checkpoint (a dense layer, a shared expert) compiled
    for rank 3 of a fake world of 4: one graph; attention, embedding and LM head on TP group
    [2, 3]; the one MoE all-reduce of the sparse layer on [0, 1, 2, 3]."""
    from torch_tensorrt_dist.generation.moe_explain import explain_moe
    from torch_tensorrt_dist.models.moe_args import read_moe_config

    args, moe = read_moe_config(ckpts["qwen2_moe"]["path"])
    report = explain_moe(args, moe, ep=2, tp=2, rank=3)
    assert report.decode.graph_count == 1 and report.groups_ok
    assert report.groups == [[2, 3], [0, 1, 2, 3]]
    rows = [(c.op, list(c.group_ranks), c.module) for c in report.decode.collectives]
    assert ("all_reduce", [0, 1, 2, 3], "layers.0.feed_forward") in rows
    assert ("all_reduce", [2, 3], "layers.1.feed_forward") in rows  # the dense layer: TP only
