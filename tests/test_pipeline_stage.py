"""Stages in one process, and explain on the fake process group for a pp 2 x tp 4 mesh."""

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
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.parallel.pipeline_load import load_stage

from . import _llama_ckpt

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_tied", "mistral_window"])
def test_chained_stages_equal_whole_model(tmp_path: Path, name: str) -> None:
    _llama_ckpt.save_checkpoint(name, tmp_path, num_hidden_layers=4)
    model = load_llama(tmp_path, progress=False)
    ref_prefill, ref_decode = _llama_ckpt._prefill_decode(model)
    for split in (None, [1, 3], [1, 1, 2]):
        pp = 2 if split is None else len(split)
        stages = [load_stage(tmp_path, stage=s, pp=pp, split=split) for s in range(pp)]
        assert sum(len(s.layer_ids) for s in stages) == 4
        assert stages[0].tok_embeddings is not None and stages[-1].output is not None
        assert all(s.output is None for s in stages[:-1])
        assert all(s.tok_embeddings is None for s in stages[1:])
        for s in stages:
            s.setup_caches(2, 32)
        tokens = torch.randint(
            0, model.args.vocab_size, (2, 10), generator=torch.Generator().manual_seed(5)
        )
        pad = torch.tensor([0, 3])
        with torch.no_grad():
            x: torch.Tensor = tokens
            for s in stages:
                x = s(x, torch.arange(10), pad)
            torch.testing.assert_close(x, ref_prefill, atol=1e-5, rtol=0)
            x = tokens[:, :1]
            for s in stages:
                x = s(x, torch.tensor([10]), pad)
            torch.testing.assert_close(x, ref_decode, atol=1e-5, rtol=0)


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
    peer = rank + 4 if stage == 0 else rank - 4
    moves = [(t.direction, t.peer, t.kind, t.shape, t.bytes) for t in rep.transfers]
    if stage == 0:
        assert moves == [
            ("send", peer, "header", (1,), 8),
            ("send", peer, "hidden", (2, 1, 64), 2 * 64 * 4),
            ("recv", peer, "token", (2,), 16),
        ]
    else:
        assert moves == [
            ("recv", peer, "header", (1,), 8),
            ("recv", peer, "hidden", (2, 1, 64), 2 * 64 * 4),
            ("send", peer, "token", (2,), 16),
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
