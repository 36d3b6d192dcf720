"""Pure parts of the pipeline layout: layer split, mesh checks, peers, transfer plan, what each
stage holds."""

from __future__ import annotations

import pytest
import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.stage_step import step_transfers
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.stage import StageRole, cut_stage
from torch_tensorrt_dist.parallel.llama_load import random_llama
from torch_tensorrt_dist.parallel.pipeline import (
    PipelineLayout,
    check_mesh,
    split_layers,
    stage_role,
    stage_tensor_names,
)


def test_split_even_uneven_and_explicit() -> None:
    assert split_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert split_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert split_layers(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert split_layers(4, 1) == [range(0, 4)]
    assert split_layers(4, 2, [1, 3]) == [range(0, 1), range(1, 4)]
    for n, pp in [(1, 1), (9, 4), (32, 5), (80, 8)]:
        ranges = split_layers(n, pp)
        assert [i for r in ranges for i in r] == list(range(n))
        assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


@pytest.mark.parametrize(
    ("n", "pp", "split", "message"),
    [
        (4, 5, None, "pp=5 stages but the model has 4 layers"),
        (4, 0, None, "pp must be >= 1"),
        (4, 2, [2, 1], "covers 3 layers, but the model has 4"),
        (4, 2, [4, 0], "every stage needs at least one layer"),
        (4, 2, [1, 1, 2], "has 3 entries; give one per stage (2)"),
    ],
)
def test_split_errors(n: int, pp: int, split: list[int] | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        split_layers(n, pp, split)


def test_check_mesh_errors() -> None:
    args = ModelArgs.from_name("tiny", n_layers=4)  # 4 heads, 2 KV heads
    check_mesh(2, 2, 4, args)
    with pytest.raises(ConfigError, match=r"pp=2 x tp=2 needs 4 ranks, but the world size is 8"):
        check_mesh(2, 2, 8)
    with pytest.raises(ConfigError, match=r"pp=8 stages but the model has 4 layers"):
        check_mesh(8, 1, 8, args)
    with pytest.raises(ConfigError, match=r"n_heads=4 is not divisible by tp=8"):
        check_mesh(1, 8, 8, args)
    with pytest.raises(ConfigError, match=r"n_heads=4 is not divisible by tp=3"):
        check_mesh(2, 3, 6, args)


def test_layout_peers_pair_tp_ranks() -> None:
    # pp 3 x tp 2: stages {0,1}, {2,3}, {4,5}; pipeline groups {0,2,4}, {1,3,5}
    lay = {r: PipelineLayout.of(r, 3, 2) for r in range(6)}
    assert [lay[r].stage for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert lay[3].tp_ranks == [2, 3] and lay[3].tp_rank == 1
    assert lay[3].pp_ranks == [1, 3, 5] and lay[4].pp_ranks == [0, 2, 4]
    assert (lay[1].prev, lay[1].next, lay[1].logits_source) == (None, 3, 5)
    assert (lay[3].prev, lay[3].next, lay[3].logits_source) == (1, 5, 5)
    assert (lay[4].prev, lay[4].next, lay[4].logits_source) == (2, None, 4)
    single = PipelineLayout.of(1, 1, 2)
    assert (single.prev, single.next, single.pp_ranks) == (None, None, [1])
    with pytest.raises(ConfigError, match="rank 6 is not on a pp=3 x tp=2 mesh"):
        PipelineLayout.of(6, 3, 2)


def test_layout_with_expert_parallel_stages() -> None:
    # pp 2 x ep 2 x tp 2: stage 1 holds ranks 4..7; rank 6 is ep rank 1, tp rank 0 there
    lay = PipelineLayout.of(6, 2, 2, ep=2)
    assert (lay.width, lay.stage, lay.tp_rank, lay.tp_ranks) == (4, 1, 0, [6, 7])
    assert (lay.prev, lay.next, lay.pp_ranks) == (2, None, [2, 6])
    with pytest.raises(ConfigError, match="rank 8 is not on a pp=2 x ep=2 x tp=2 mesh"):
        PipelineLayout.of(8, 2, 2, ep=2)


def test_stage_roles_and_the_deepest_stage() -> None:
    roles = [stage_role(5, PipelineLayout.of(r, 2, 1), [1, 4]) for r in range(2)]
    assert [(r.index, r.layers, r.first, r.last) for r in roles] == [
        (0, range(0, 1), True, False),
        (1, range(1, 5), False, True),
    ]
    assert {r.kv_layers for r in roles} == {4}  # every rank's KV pool: the deepest stage's


def test_step_transfers_match_between_peers() -> None:
    pp, tp, dim, vocab = 3, 2, 64, 100
    plans = {
        r: step_transfers(
            PipelineLayout.of(r, pp, tp),
            rows=2,
            tokens=1,
            dim=dim,
            vocab=vocab,
            dtype=torch.bfloat16,
        )
        for r in range(pp * tp)
    }
    sends = {
        (r, t.peer, t.kind, t.shape) for r, p in plans.items() for t in p if t.direction == "send"
    }
    recvs = {
        (t.peer, r, t.kind, t.shape) for r, p in plans.items() for t in p if t.direction == "recv"
    }
    assert sends == recvs  # every send has its receive, same shape
    hidden = next(t for t in plans[0] if t.kind == "hidden")
    assert hidden.shape == (2, 1, dim) and hidden.bytes == 2 * dim * 2
    logits = [(t.direction, t.peer, t.bytes) for t in plans[5] if t.kind == "logits"]
    assert logits == [("send", 1, 2 * vocab * 2), ("send", 3, 2 * vocab * 2)]
    assert [t.kind for t in plans[2]] == ["hidden", "hidden", "logits"]  # a middle stage


def test_cut_stage_keeps_its_parts_and_the_whole_models_names() -> None:
    args = ModelArgs.from_name("tiny", n_layers=4, tie_embeddings=True)
    whole = dict(random_llama(args).named_parameters())
    first = random_llama(args, stage=StageRole(0, 2, range(0, 2), 2))
    last = random_llama(args, stage=StageRole(1, 2, range(2, 4), 2))
    assert len(first.blocks) == 2 and first.output is None and not hasattr(first, "norm")
    # the tied head reads the embedding matrix: the last stage keeps it (its only embedding)
    assert hasattr(last, "tok_embeddings") and hasattr(last, "norm")
    for stage in (first, last):
        for name, p in stage.named_parameters():
            assert torch.equal(p, whole[name]), name  # the whole model's weights, same names
    names = {n.split(".")[1] for n, _ in last.named_parameters() if n.startswith("layers.")}
    assert names == {"2", "3"}
    with pytest.raises(ConfigError, match="stage 2 is not a stage of pp=2"):
        cut_stage(random_llama(args), StageRole(2, 2, range(0, 1)))


def test_each_stage_reads_only_its_layers() -> None:
    args = ModelArgs.from_name("tiny", n_layers=5, tie_embeddings=False)
    first, last = stage_tensor_names(args, 0, 2), stage_tensor_names(args, 1, 2)
    assert "model.embed_tokens.weight" in first and "lm_head.weight" not in first
    assert {n.split(".")[2] for n in first if n.startswith("model.layers.")} == {"0", "1", "2"}
    assert {n.split(".")[2] for n in last if n.startswith("model.layers.")} == {"3", "4"}
    assert "lm_head.weight" in last and "model.norm.weight" in last
    assert "model.embed_tokens.weight" not in last
