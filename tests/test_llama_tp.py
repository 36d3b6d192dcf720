"""The TP plan: layouts, slices, errors, and 2 all-reduces per layer in the decode graph.

Sharded numerics on gloo ranks are in test_generate_tp.py (one spawn for all of them)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama import ModelArgs
from torch_tensorrt_dist.parallel.llama import ShardSlice, shard_slice, tp_layout
from torch_tensorrt_dist.parallel.llama_load import random_llama


def test_layout_errors_name_the_fix() -> None:
    args = ModelArgs(dim=96, n_heads=12, n_kv_heads=4, intermediate_size=192)
    msg = r"n_heads=12 is not divisible by tp=5; use tp in \[1, 2, 4, 12\]"
    with pytest.raises(ConfigError, match=msg):
        tp_layout(args, 0, 5)
    with pytest.raises(ConfigError, match="num_key_value_heads=4 and tp=6"):
        tp_layout(args, 0, 6)
    with pytest.raises(ConfigError, match="intermediate_size=100 is not divisible by tp=8"):
        tp_layout(ModelArgs(dim=64, n_heads=8, n_kv_heads=8, intermediate_size=100), 0, 8)


def test_shard_slices() -> None:
    args = ModelArgs(dim=64, n_heads=8, n_kv_heads=2, vocab_size=130, intermediate_size=128)
    lay = tp_layout(args, 3, 4)  # KV heads replicated: ranks 2, 3 share KV head 1
    assert shard_slice("layers.0.attention.wq.weight", lay) == ShardSlice(0, 48, 64, 16)
    assert shard_slice("layers.0.attention.wk.bias", lay) == ShardSlice(0, 8, 16, 8)
    assert shard_slice("layers.1.attention.wo.weight", lay) == ShardSlice(1, 48, 64, 16)
    assert shard_slice("layers.1.feed_forward.w2.weight", lay) == ShardSlice(1, 96, 128, 32)
    assert shard_slice("output.weight", lay) == ShardSlice(0, 99, 130, 33)  # padded 31 -> 33
    assert shard_slice("norm.weight", lay) is None
    assert shard_slice("tok_embeddings.weight", lay) == ShardSlice(0, 99, 130, 33)
    assert lay.vocab_start == 99
    replicated = tp_layout(args, 3, 4, "replicated", "replicated")
    assert shard_slice("output.weight", replicated) is None
    assert shard_slice("tok_embeddings.weight", replicated) is None
    with pytest.raises(ConfigError, match="embedding='rows'; use 'vocab_parallel' or"):
        tp_layout(args, 0, 2, embedding="rows")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("world", "embedding"), [(2, "vocab_parallel"), (4, "vocab_parallel"), (2, "replicated")]
)
def test_decode_graph_has_two_all_reduces_per_layer(world: int, embedding: str) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import torch_tensorrt_dist
    from torch_tensorrt_dist.parallel import make_mesh

    dist.init_process_group("fake", store=FakeStore(), rank=world - 1, world_size=world)
    try:
        mesh = make_mesh(tp=2)  # (dp, tp): the TP sub-group, never the world group
        args = ModelArgs.from_name("tiny", n_layers=3)
        model = random_llama(args, group=mesh["tp"], embedding=embedding)  # type: ignore[arg-type]
        model.setup_caches(1, 64)

        def decode(tokens: torch.Tensor, pos: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            return model(tokens, pos, pad)[:, -1]

        report = torch_tensorrt_dist.explain(
            decode,
            torch.zeros(1, 1, dtype=torch.long),
            torch.tensor([7]),
            torch.zeros(1, dtype=torch.long),
        )
    finally:
        dist.destroy_process_group()
    where = [(c.op, c.module) for c in report.collectives]
    assert report.graph_count == 1 and not report.graph_breaks
    layers = [
        ("all_reduce", f"layers.{i}.{part}")
        for i in range(args.n_layers)
        for part in ("attention", "feed_forward")
    ]
    embed = [("all_reduce", "tok_embeddings")] if embedding == "vocab_parallel" else []
    assert where == [*embed, *layers, ("all_gather", "")]
    tp_ranks = [world - 2, world - 1]
    assert all(list(c.group_ranks) == tp_ranks for c in report.collectives)
    assert all(c.shape[-1] == args.dim for c in report.collectives[:-1])
