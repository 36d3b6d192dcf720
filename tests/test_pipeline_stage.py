"""Stages in one process equal the whole model's paged step; explain on the fake process group
for a pp 2 x tp 4 mesh."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.pipeline_explain import (
    PipelineExplainReport,
    explain_pipeline,
    explain_stages,
)
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.stage import StageRole
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.parallel.pipeline import split_layers

from . import _llama_ckpt

pytest.importorskip("transformers")

LIMITS = StepLimits(rows=2, tokens=16, blocks=8, block_size=4)


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_tied", "mistral_window", "qwen3_hd24"])
def test_chained_stages_equal_whole_model(tmp_path: Path, name: str) -> None:
    """A prefill of two rows (different lengths) then a decode step, through the whole model's
    paged step and through each split's stages in turn (hidden states handed on): the same
    logits, and each stage's pools hold its layers' K/V at the same blocks."""
    _llama_ckpt.save_checkpoint(name, tmp_path, num_hidden_layers=4)
    whole = load_llama(tmp_path, progress=False)
    whole.setup_paged(9, 4, 32)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, whole.args.vocab_size, (2, 10), generator=g).tolist()
    prefill = step_inputs([(ids[0], 0, [1, 2, 3]), (ids[1][:7], 0, [4, 5])], LIMITS, "cpu")
    decode = step_inputs([([ids[0][-1]], 10, [1, 2, 3]), ([5], 7, [4, 5])], LIMITS, "cpu")
    with torch.no_grad():
        refs = [whole.paged_step(*prefill), whole.paged_step(*decode)]
    for split in (None, [1, 3], [1, 1, 2]):
        pp = 2 if split is None else len(split)
        ranges = split_layers(4, pp, split)
        roles = [StageRole(s, pp, ranges[s], max(map(len, ranges))) for s in range(pp)]
        stages = [load_llama(tmp_path, progress=False, stage=role) for role in roles]
        assert [len(s.blocks) for s in stages] == list(map(len, ranges))
        for s in stages:
            s.setup_paged(9, 4, 32)
        for inputs, ref in zip((prefill, decode), refs, strict=True):
            x = inputs[0]
            with torch.no_grad():
                for s in stages:
                    x = s.paged_step(x, *inputs[1:])
            torch.testing.assert_close(x, ref, atol=1e-5, rtol=0)
        for s in stages:
            for i, block in zip(s.stage.layers, s.blocks, strict=True):
                mine, theirs = block.attention.kv_pages, whole.blocks[i].attention.kv_pages
                assert mine is not None and theirs is not None
                torch.testing.assert_close(mine.k_pool, theirs.k_pool, atol=1e-5, rtol=0)


ARGS = ModelArgs.from_name("tiny", n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=250)


@pytest.fixture(scope="module")
def reports() -> dict[int, PipelineExplainReport]:
    out = {rep.layout.rank: rep for rep in explain_stages(ARGS, pp=2, tp=4, tp_rank=3, batch=2)}
    out[5] = explain_pipeline(ARGS, pp=2, tp=4, rank=5, batch=2)
    return out


@pytest.mark.parametrize("rank", [3, 7, 5])
def test_explain_pp2_tp4_collectives_on_stage_group_and_transfers(
    reports: dict[int, PipelineExplainReport], rank: int
) -> None:
    rep = reports[rank]
    stage = rank // 4
    group = [4 * stage + t for t in range(4)]
    assert rep.layers == ([0, 1] if stage == 0 else [2, 3])
    assert rep.decode.graph_count == 1 and rep.decode.graph_breaks == []
    assert rep.groups_ok
    where = [(c.op, c.module) for c in rep.decode.collectives]
    # 2 all-reduces per layer; the first stage adds the vocab-parallel embedding's all-reduce,
    # the last the vocab-parallel logits all-gather
    layers = [(f"layers.{i}.attention", f"layers.{i}.feed_forward") for i in rep.layers]
    expected = [("all_reduce", m) for pair in layers for m in pair]
    if stage == 0:
        expected.insert(0, ("all_reduce", "tok_embeddings"))
    else:
        expected.append(("all_gather", ""))
    assert where == expected
    assert all(list(c.group_ranks) == group for c in rep.decode.collectives)
    assert all(tuple(c.shape)[:2] == (2, 1) for c in rep.decode.collectives)
    # the paged step: each layer reads its blocks and writes the step's K/V in place
    assert len(rep.decode.graphs[0].paged) > 0
    peer = rank + 4 if stage == 0 else rank - 4
    moves = [(t.direction, t.peer, t.kind, t.shape, t.bytes) for t in rep.transfers]
    if stage == 0:
        assert moves == [
            ("send", peer, "hidden", (2, 1, 64), 2 * 64 * 4),
            ("recv", peer, "logits", (2, 250), 2 * 250 * 4),
        ]
    else:
        assert moves == [
            ("recv", peer, "hidden", (2, 1, 64), 2 * 64 * 4),
            ("send", peer, "logits", (2, 250), 2 * 250 * 4),
        ]
    text = str(rep)
    assert f"pipeline stage {stage} of 2 (rank {rank}" in text and f"{group}" in text
    assert rep.as_dict()["groups_ok"] is True


def test_explain_bad_meshes() -> None:
    with pytest.raises(ConfigError, match="n_heads=8 is not divisible by tp=16"):
        explain_pipeline(ARGS, pp=1, tp=16, rank=0)
    with pytest.raises(ConfigError, match="pp=8 stages but the model has 4 layers"):
        explain_pipeline(ARGS, pp=8, tp=1, rank=0)
    with pytest.raises(ConfigError, match="tp_rank=4 is not a TP rank of tp=4"):
        explain_stages(ARGS, pp=2, tp=4, tp_rank=4)
